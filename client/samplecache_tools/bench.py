"""``samplecache bench``: how fast does the client read *your* cache, and with how many workers?

Reads the daemon's current epoch (no new epoch is sealed) with the per-sample
and batched paths at ``num_workers`` 0..N, warm, and recommends the fastest
setting. Every pass is counted so a setting cannot win by skipping work.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import urllib.request
from typing import Any

import torch
from torch.utils.data import DataLoader

from samplecache.pytorch.dataset import SampleCacheDataset
from samplecache.pytorch.loader import SampleCacheLoader


def _latest_epoch(url: str) -> int:
    with urllib.request.urlopen(url.rstrip("/") + "/v1/status", timeout=10) as r:
        status = json.loads(r.read())
    if status["last_epoch"] < 0:
        raise SystemExit("samplecache bench: no epoch is sealed yet; start training (or GET /v1/epochs/0) first")
    return int(status["last_epoch"])


def measure(url: str, epoch: int, workers: int, batch_size: int, batched: bool, passes: int,
            max_samples: int | None) -> dict[str, Any]:
    """Median samples/s and MB/s of one setting over ``passes`` warm passes (after one warm-up)."""
    ds = SampleCacheDataset(url, batch_size=batch_size if batched else None, prefetch_next=False, lease=True)
    loader: DataLoader[Any]
    if batched:
        loader = SampleCacheLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
    else:
        loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)
    plan = ds.plan(epoch)
    per_sample = plan.manifest["bytes"] / max(1, plan.total)
    rates = []
    for p in range(passes + 1):
        ds.set_epoch(epoch)
        n, t0 = 0, time.perf_counter()
        for batch in loader:
            n += len(next(iter(batch.values())))
            if max_samples and n >= max_samples:
                break
        dt = time.perf_counter() - t0
        if p:
            rates.append(n / dt)
    rate = statistics.median(rates)
    return {"path": "batched" if batched else "per-sample", "workers": workers, "samples_per_s": rate,
            "mb_per_s": rate * per_sample / 1e6}


def run_bench(url: str, max_workers: int | None = None, batch_size: int = 256, passes: int = 2,
              max_samples: int | None = 200_000) -> int:
    torch.set_num_threads(1)
    epoch = _latest_epoch(url)
    top = max_workers if max_workers is not None else min(8, os.cpu_count() or 1)
    print(f"samplecache bench: epoch {epoch} of {url}, batch size {batch_size}, workers 0..{top}, "
          f"{passes} warm passes each", flush=True)
    rows = []
    for batched in (False, True):
        for w in range(top + 1):
            r = measure(url, epoch, w, batch_size, batched, passes, max_samples)
            rows.append(r)
            print(f"  {r['path']:<10} workers={w:<2} {r['samples_per_s']:>12,.0f} samples/s "
                  f"{r['mb_per_s']:>10,.1f} MB/s", flush=True)
    best = max(rows, key=lambda r: r["samples_per_s"])
    enough = min((r for r in rows if r["samples_per_s"] >= 0.9 * best["samples_per_s"]),
                 key=lambda r: (r["workers"], r["path"] != "batched"))
    how = ("SampleCacheDataset(url, batch_size=B) + SampleCacheLoader(ds, batch_size=None, num_workers=W)"
           if enough["path"] == "batched" else "DataLoader(SampleCacheDataset(url), batch_size=B, num_workers=W)")
    print(f"recommendation: {enough['path']} path with num_workers={enough['workers']} "
          f"({enough['samples_per_s']:,.0f} samples/s, within 10% of the best with the fewest workers): {how}. "
          f"Transforms that need CPU time need more workers than raw reading.")
    return 0
