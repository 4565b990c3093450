"""The training side of ``tests/e2e/test_multinode.py``: one rank of a 2-host torchrun job (gloo over the veth).

Reads its own host's daemon with ``SampleCacheDataset`` and all-reduces once per step, as DDP would. The job
runs phases one after the other, epochs numbered on across phases (``--phases loader-pad:2,readme:1``):

* ``loader-pad`` / ``loader-drop``: ``SampleCacheLoader(ds, batch_size, num_workers)``, ``partial="pad"/"drop"``;
* ``readme``: the README's loop: plain ``DataLoader(ds, batch_size, num_workers, persistent_workers=True)`` with
  ``ds.set_epoch(epoch)`` every epoch (``partial="pad"``).

Every collective is an all-reduce of ``[1, epoch, step]`` (``step = -1`` closes an epoch), so ranks that disagree
on the number of steps are caught at the first mismatched step (the sums do not add up) instead of hanging or
silently pairing one rank's step k with another rank's next epoch.

Writes ``OUT/rank<R>.json`` even when it fails: node, what a DataLoader worker sees as rank and world, and per
epoch the manifest as this rank saw it, the agreed samples per rank, the ids (and f32 values) of every step, and
the error if any.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from samplecache import SampleCacheDataset, SampleCacheLoader

PHASES = {"loader-pad": ("loader", "pad"), "loader-drop": ("loader", "drop"), "readme": ("readme", "pad")}


class WorkerView(IterableDataset):  # type: ignore[type-arg]
    """What the client's topology looks like inside a DataLoader worker."""

    def __iter__(self) -> Any:
        import samplecache.pytorch.dataset as scd

        info = get_worker_info()
        view: dict[str, Any] = {"worker": -1 if info is None else info.id}
        if hasattr(scd, "topology"):
            view["topology"] = list(scd.topology())
        view["dist_rank_world"] = list(scd.dist_rank_world())
        yield view


class Desync(RuntimeError):
    """The ranks are not at the same step: DDP would hang or mix steps here."""


def collective(epoch: int, step: int) -> None:
    world = dist.get_world_size()
    t = torch.tensor([1.0, float(epoch), float(step)], dtype=torch.float64)
    dist.all_reduce(t)
    want = [float(world), float(world * epoch), float(world * step)]
    if t.tolist() != want:
        raise Desync(f"all_reduce of [1, epoch, step] = {t.tolist()}, expected {want} (this rank: epoch "
                     f"{epoch}, step {step}{' = end of epoch' if step < 0 else ''}): the ranks' step counts differ")


def agreed(ds: SampleCacheDataset, epoch: int) -> int | None:
    clock = getattr(ds, "_clock", None)
    return clock.agreed(epoch) if clock is not None and hasattr(clock, "agreed") else None


def describe(ds: SampleCacheDataset, ep: dict[str, Any]) -> None:
    """This host's manifest of the epoch (sealed already: a GET at most) and the samples per rank agreed."""
    plan = ds.plan(ep["epoch"])
    ep.update(manifest_samples=plan.total, manifest_shards=[int(i) for i in plan.ids], agreed=agreed(ds, ep["epoch"]))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--phases", default="loader-pad:2,loader-drop:1,readme:1")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dist-timeout", type=float, default=30.0)
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    record: dict[str, Any] = {
        "rank": rank, "world": world, "node": int(os.environ.get("GROUP_RANK", -1)),
        "local_rank": int(os.environ.get("LOCAL_RANK", -1)),
        "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", -1)),
        "url": args.url, "epochs": [], "error": None, "done": False, "started": time.time()}
    out = Path(args.out) / f"rank{rank}.json"

    def save() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(out)

    # the test stops a hung job with SIGTERM first: leave through `finally` so the record is written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.dist_timeout))
        record["worker_view"] = list(DataLoader(WorkerView(), batch_size=None, num_workers=args.workers))
        epoch = 0
        for spec in args.phases.split(","):
            name, n = spec.split(":")
            kind, partial = PHASES[name]
            ds = SampleCacheDataset(args.url, columns=["id", "f32"], seed=1234, partial=partial, wait=30.0,
                                    retries=3)
            if kind == "loader":
                loader: DataLoader[Any] = SampleCacheLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
            else:
                loader = DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True)
            for _ in range(int(n)):
                ep: dict[str, Any] = {"epoch": epoch, "phase": name, "partial": partial, "steps": 0, "ids": [],
                                      "f32": [], "complete": False}
                record["epochs"].append(ep)
                ds.set_epoch(epoch)
                for batch in loader:
                    collective(epoch, ep["steps"])
                    ep["steps"] += 1
                    ep["ids"].append([int(i) for i in batch["id"]])
                    ep["f32"].append([float(v) for v in batch["f32"]])
                describe(ds, ep)
                collective(epoch, -1)
                ep["complete"] = True  # every rank closed the epoch at the same step
                save()
                epoch += 1
            del loader
        record["done"] = True
        return 0
    except BaseException as e:  # noqa: BLE001 - recorded, then re-raised
        record["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        if record["epochs"] and "manifest_samples" not in record["epochs"][-1] and "ds" in locals():
            try:
                describe(ds, record["epochs"][-1])
            except Exception as e2:  # noqa: BLE001 - only a diagnostic
                record["describe_error"] = repr(e2)
        raise
    finally:
        record["finished"] = time.time()
        save()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
