"""One training job as a test runs it: the README loop (SampleCacheLoader, DataLoader workers) over N epochs.

    python job_reader.py CONFIG_JSON

Config: url, out (a JSON file), epochs (how many), workers, batch_size, seed, job (name or null), delay (s
per batch, to overlap jobs), resume (path of a progress file to resume from, or null), ddp (bool: under
torchrun, gloo; out gets -rank{R} before .json).

After every batch the progress file ``out`` is replaced atomically with the loader's state and every id
delivered so far, so a SIGKILL at any moment leaves a consistent record. For each epoch it also records
the daemon epoch the job read and that epoch's ids, read straight from LMDB while the job's lease pins them
(after the first batch): the ground truth of exactly-once on a cache that keeps rolling.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import client_common as cc
import torch
import torch.distributed as dist

from samplecache import SampleCacheDataset, SampleCacheLoader
from samplecache.api.client import fetch_manifest


def job_epoch_ids(url: str, job: str, epoch: int) -> tuple[int, list[int]]:
    """(daemon epoch, ids of its manifest) of the job's epoch, from /v1/jobs and LMDB."""
    with urllib.request.urlopen(f"{url}/v1/jobs/{job}", timeout=30) as r:
        info = json.loads(r.read())
    daemon_epoch = next(e["daemon_epoch"] for e in info["epochs"] if e["job_epoch"] == epoch)
    return daemon_epoch, cc.manifest_order_ids(fetch_manifest(url, daemon_epoch))


def write(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def main() -> int:
    cfg = json.loads(sys.argv[1])
    out = Path(cfg["out"])
    rank = 0
    if cfg.get("ddp"):
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
        rank = dist.get_rank()
        out = out.with_name(f"{out.stem}-rank{rank}.json")
    ds = SampleCacheDataset(cfg["url"], columns=["id"], seed=cfg.get("seed", 0), job=cfg.get("job"), wait=30)
    loader = SampleCacheLoader(ds, batch_size=cfg.get("batch_size", 16), num_workers=cfg.get("workers", 2),
                               persistent_workers=cfg.get("workers", 2) > 0)
    record: dict[str, Any] = {"job": ds.job, "epochs": {}, "state": None, "pid": os.getpid()}
    first_epoch = 0
    if cfg.get("resume"):
        saved = json.loads(Path(cfg["resume"]).read_text())
        loader.load_state_dict(saved["state"])
        first_epoch = int(saved["state"]["epoch"])
        record = {**saved, "pid": os.getpid(), "resumed_at": saved["state"]}
    with loader:
        for epoch in range(first_epoch, first_epoch + int(cfg["epochs"])):
            ds.set_epoch(epoch)
            got = record["epochs"].setdefault(str(epoch), {"ids": [], "steps": 0})
            for batch in loader:
                ids = [int(i) for i in batch["id"].tolist()]
                if "expected" not in got:
                    got["daemon_epoch"], got["expected"] = job_epoch_ids(cfg["url"], ds.job, epoch)
                got["ids"].extend(ids)
                got["steps"] += 1
                if cfg.get("ddp"):
                    t = torch.ones(1)
                    dist.all_reduce(t)  # unequal step counts across ranks would hang here
                record["state"] = loader.state_dict()
                write(out, record)
                time.sleep(float(cfg.get("delay", 0)))
            record["state"] = loader.state_dict()
            write(out, record)
    record["done"] = True
    write(out, record)
    if cfg.get("ddp"):
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
