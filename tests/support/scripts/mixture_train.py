"""One DDP rank for tests/e2e/test_mixtures.py; run under ``torchrun --nproc-per-node N`` (gloo, CPU).

usage: mixture_train.py URL OUT_DIR CONFIG_JSON [STATE_JSON]

Reads ``epochs`` epochs of a weighted mixture through ``SampleCacheLoader`` (CONFIG: run, job, mixture, mix,
seed, batch_size, workers, epochs, then_mixture, checkpoint, sleep), appending every batch's ids with its epoch to
OUT_DIR/ids-<run>-rank<r>.jsonl (one JSON line, flushed) and ``all_reduce``-ing after every step, as DDP does.
``then_mixture``: ``ds.set_mixture`` after the first epoch. After step ``checkpoint`` of the first epoch rank 0
saves ``loader.state_dict()`` to OUT_DIR/state-<run>.json and the ranks go on (``sleep`` s per step) until the test
SIGKILLs them. With STATE_JSON every rank loads that state and reads the rest of its epoch (with the mixture
CONFIG gives, which the state overrules for that epoch); OUT_DIR/done-<run>-rank<r>.json marks the end.
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
    ds = SampleCacheDataset(url, columns=["id"], seed=int(cfg.get("seed", 0)), job=cfg.get("job"),
                            mixture=cfg["mixture"], mix=cfg.get("mix", "random"), prefetch_next=False)
    loader = SampleCacheLoader(ds, batch_size=int(cfg["batch_size"]), num_workers=int(cfg["workers"]))
    if state is not None:
        loader.load_state_dict(state)
    checkpoint, sleep = int(cfg.get("checkpoint", -1)), float(cfg.get("sleep", 0.0))
    counts = {}
    with open(out / f"ids-{run}-rank{rank}.jsonl", "a") as ids_file:
        for n in range(int(cfg.get("epochs", 1))):
            epoch = None
            for step, batch in enumerate(loader, 1):
                epoch = ds.current_epoch()
                ids_file.write(json.dumps([epoch, [int(i) for i in batch["id"].tolist()]]) + "\n")
                ids_file.flush()
                t = torch.ones(1)
                dist.all_reduce(t)  # every rank makes the same steps, or this blocks
                if n == 0 and step == checkpoint and rank == 0:
                    tmp = out / f".state-{run}.json.tmp"
                    tmp.write_text(json.dumps(loader.state_dict()))
                    os.replace(tmp, out / f"state-{run}.json")
                if sleep:
                    time.sleep(sleep)
            counts[str(epoch)] = ds.mixture_counts(epoch) if epoch is not None else None
            if n == 0 and cfg.get("then_mixture"):
                ds.set_mixture(cfg["then_mixture"])
    (out / f"done-{run}-rank{rank}.json").write_text(json.dumps({"counts": counts}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
