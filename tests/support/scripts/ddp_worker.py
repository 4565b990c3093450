"""One DDP rank for tests/e2e/test_client_ddp.py; run under ``torchrun --nproc-per-node N`` (gloo, CPU).

usage: ddp_worker.py URL OUT_DIR CONFIGS_JSON

For every config (a dict: name, partial, batched, batch_size, shuffle, seed, epochs, workers, drop_last) the
rank reads each epoch through ``DataLoader(num_workers=workers)`` and ``all_reduce``s a tensor after every step
(a rank with fewer steps would leave the others blocked in ``all_reduce``: the test sees a hang). It writes
OUT_DIR/<name>-rank<r>.json: per epoch, every batch as (worker, ids) in delivery order, and the step count.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, get_worker_info

from samplecache import SampleCacheDataset


def tag_worker(item: dict[str, Any]) -> dict[str, Any]:
    """Transform (runs in the DataLoader worker): record which worker produced the sample or batch."""
    info = get_worker_info()
    item["worker"] = -1 if info is None else info.id
    return item


def run(url: str, out: Path, cfg: dict[str, Any], rank: int, world: int) -> None:
    batched = bool(cfg.get("batched"))
    b = int(cfg["batch_size"])
    ds = SampleCacheDataset(url, columns=["id"], transform=tag_worker, shuffle=cfg.get("shuffle", True),
                            seed=cfg.get("seed", 0), partial=cfg["partial"], batch_size=b if batched else None,
                            drop_last=cfg.get("drop_last", False))
    loader = DataLoader(ds, batch_size=None if batched else b, num_workers=cfg.get("workers", 2),
                        drop_last=False if batched else cfg.get("drop_last", False))
    result: dict[str, Any] = {"rank": rank, "world": world, "config": cfg, "epochs": {}}
    for epoch in cfg["epochs"]:
        ds.set_epoch(epoch)
        batches = []
        steps = 0
        for batch in loader:
            ids = [int(i) for i in batch["id"].tolist()]
            w = batch["worker"]
            workers = sorted({int(x) for x in (w.tolist() if torch.is_tensor(w) else [w])})
            assert len(workers) == 1, f"one batch came from several workers: {workers}"
            batches.append([workers[0], ids])
            t = torch.ones(1)
            dist.all_reduce(t)  # every rank must make the same number of steps, or this blocks
            assert int(t.item()) == world
            steps += 1
        total_steps = torch.tensor([steps])
        dist.all_reduce(total_steps)
        result["epochs"][str(epoch)] = {"batches": batches, "steps": steps, "steps_sum": int(total_steps.item()),
                                        "current_epoch": ds.current_epoch()}
    tmp = out / f".{cfg['name']}-rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out / f"{cfg['name']}-rank{rank}.json")


def main() -> int:
    url, out, configs = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    for cfg in configs:
        run(url, out, cfg, rank, world)
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
