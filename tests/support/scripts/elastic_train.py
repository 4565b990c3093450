"""One DDP rank for tests/e2e/test_elastic_resume.py; run under ``torchrun --nproc-per-node N`` (gloo, CPU).

usage: elastic_train.py URL OUT_DIR CONFIG_JSON [STATE_JSON]

Reads one epoch through ``SampleCacheLoader`` (CONFIG: run, seed, epoch, batch_size, workers, checkpoint, sleep),
appending every batch's ids to OUT_DIR/ids-<run>-rank<r>.jsonl (one JSON line, flushed) and ``all_reduce``-ing
after every step, as DDP does. After step ``checkpoint`` rank 0 saves ``loader.state_dict()`` to
OUT_DIR/state-<run>.json (tmp + rename) and the ranks go on (``sleep`` s per step) until the test SIGKILLs them.
With STATE_JSON every rank loads that state (rank 0's, saved by another topology) and reads the rest of the epoch;
OUT_DIR/done-<run>-rank<r>.json marks the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from samplecache import SampleCacheDataset, SampleCacheLoader


def main() -> int:
    url, out, cfg = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    state = json.loads(Path(sys.argv[4]).read_text()) if len(sys.argv) > 4 else None
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    run = cfg["run"]
    ds = SampleCacheDataset(url, columns=["id"], seed=int(cfg["seed"]), prefetch_next=False)
    loader = SampleCacheLoader(ds, batch_size=int(cfg["batch_size"]), num_workers=int(cfg["workers"]))
    if state is not None:
        loader.load_state_dict(state)
    else:
        ds.set_epoch(int(cfg["epoch"]))
    checkpoint, sleep = int(cfg.get("checkpoint", -1)), float(cfg.get("sleep", 0.0))
    with open(out / f"ids-{run}-rank{rank}.jsonl", "a") as ids_file:
        for step, batch in enumerate(loader, 1):
            ids_file.write(json.dumps([int(i) for i in batch["id"].tolist()]) + "\n")
            ids_file.flush()
            t = torch.ones(1)
            dist.all_reduce(t)  # every rank makes the same steps, or this blocks
            if step == checkpoint and rank == 0:
                tmp = out / f".state-{run}.json.tmp"
                tmp.write_text(json.dumps(loader.state_dict()))
                os.replace(tmp, out / f"state-{run}.json")
            if sleep:
                time.sleep(sleep)
    (out / f"done-{run}-rank{rank}.json").write_text(json.dumps({"epoch": ds.current_epoch()}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
