"""A training process for tests/e2e/test_client_resume.py: reads one epoch through ``SampleCacheLoader``.

usage: resume_train.py URL OUT_DIR CONFIG_JSON [STATE_JSON]

After every batch it appends the batch's ids (one JSON line, flushed) to OUT_DIR/ids-<run>.jsonl and then saves
``loader.state_dict()`` to OUT_DIR/state.json (write tmp + fsync + rename), so a SIGKILL at any moment leaves a
complete state whose ``batches`` lines of the ids file were consumed. With STATE_JSON it resumes from that
state and reads the rest of the epoch. CONFIG: seed, workers, batch_size, batched (bool), shuffle_buffer,
epoch, sleep (seconds per batch, so the test can kill it mid-epoch), run (a name for the ids file).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from samplecache import SampleCacheDataset, SampleCacheLoader


def save_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> int:
    url, out, cfg = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    state = json.loads(Path(sys.argv[4]).read_text()) if len(sys.argv) > 4 else None
    b = int(cfg.get("batch_size", 16))
    batched = bool(cfg.get("batched"))
    ds = SampleCacheDataset(url, columns=["id"], seed=int(cfg.get("seed", 0)), batch_size=b if batched else None,
                            shuffle_buffer=int(cfg.get("shuffle_buffer", 0)))
    loader = SampleCacheLoader(ds, batch_size=None if batched else b, num_workers=int(cfg.get("workers", 2)))
    if state is not None:
        loader.load_state_dict(state)
    else:
        ds.set_epoch(int(cfg.get("epoch", 0)))
    sleep = float(cfg.get("sleep", 0.0))
    with open(out / f"ids-{cfg.get('run', 'run')}.jsonl", "a") as ids_file:
        for batch in loader:
            ids_file.write(json.dumps([int(i) for i in batch["id"].tolist()]) + "\n")
            ids_file.flush()
            save_json(out / "state.json", loader.state_dict())
            if sleep:
                time.sleep(sleep)
    save_json(out / f"done-{cfg.get('run', 'run')}.json", {"epoch": ds.current_epoch(), "final": loader.state_dict()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
