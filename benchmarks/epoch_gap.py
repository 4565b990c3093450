"""The stall at epoch boundaries: time from the last batch of epoch N to the first batch of N+1.

Runs the real daemon on a generated dataset, trains nothing, and reads several
epochs through DataLoader (0 workers; 2 persistent workers; 2 non-persistent
workers) recording when every batch arrives. Prints, per setting, the median
batch interval and the boundary gaps; the target is gap <= one batch time.

    python -m benchmarks.epoch_gap [--samples 200000] [--epochs 4] [--json out.json] [--quick] [--workdir DIR]

The data and the cache live in a temporary directory under ``--workdir`` (default ./bench-data), removed at
the end.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from samplecache import SampleCacheDataset

from .harness import cli, report, start_daemon, stop_daemon, wait_samples
from .harness.cli import log


def write_data(directory: Path, samples: int, width: int = 64) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file = max(1, samples // 8)
    for f in range(0, samples, per_file):
        n = min(per_file, samples - f)
        x = rng.integers(0, 255, size=(n, width), dtype=np.uint8)
        table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), width),
                          "y": pa.array(np.arange(f, f + n, dtype=np.int64))})
        pq.write_table(table, directory / f"part-{f:08d}.parquet", row_group_size=max(1, n // 4))


class InMemory(IterableDataset):  # type: ignore[type-arg]
    """The baseline: the same number of samples from memory, to show DataLoader's own boundary cost."""

    def __init__(self, samples: int, width: int = 64) -> None:
        self.samples, self.x = samples, np.zeros(width, np.uint8)

    def __iter__(self) -> Any:
        info = get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(k, self.samples, n):
            yield {"x": self.x, "y": i}


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def gaps(url: str | None, epochs: int, workers: int, persistent: bool, batch: int, first_epoch: int,
         step_ms: float, samples: int) -> dict[str, Any]:
    ds: Any = SampleCacheDataset(url, seed=1) if url else InMemory(samples)
    loader = DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=persistent)
    stamps: list[list[float]] = []
    for e in range(first_epoch, first_epoch + epochs):
        if url:
            ds.set_epoch(e)
        times = []
        for _ in loader:
            times.append(time.perf_counter())
            busy(step_ms)  # the training step
        stamps.append(times)
    intervals = [b - a for ts in stamps for a, b in zip(ts[len(ts) // 10:], ts[len(ts) // 10 + 1:])]
    batch_time = statistics.median(intervals)
    boundary = [stamps[i + 1][0] - stamps[i][-1] for i in range(len(stamps) - 1)]
    return {"loader": "samplecache" if url else "in-memory", "workers": workers, "persistent": persistent,
            "step_ms": step_ms, "batch_ms": batch_time * 1e3,
            "gaps_ms": [g * 1e3 for g in boundary], "worst_gap_in_batches": max(boundary) / batch_time}


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    cli.common(ap, quick="20,000 samples, 2 epochs (a smoke run)")
    ap.add_argument("--samples", type=int, default=None, help="samples (default 200000; --quick 20000)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per setting (default 4; --quick 2)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--step-ms", type=float, default=0.0, help="simulated training step (busy CPU) per batch")
    args = ap.parse_args(argv)
    samples = args.samples or (20_000 if args.quick else 200_000)
    epochs = args.epochs or (2 if args.quick else 4)
    if epochs < 2:
        ap.error("--epochs must be >= 2 (a boundary needs two epochs)")
    torch.set_num_threads(1)
    load_start = report.loadavg()
    args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="samplecache-gap-", dir=args.workdir) as tmp:
        root = Path(tmp).resolve()
        write_data(root / "remote", samples)
        d = start_daemon(f"file://{root / 'remote'}", root / "cache", samplers=2, log_level=None)
        try:
            wait_samples(d, samples, log, name="epoch_gap", budget=300, exact=False)
            rows, first = [], 0
            for workers, persistent in ((0, False), (2, True), (2, False)):
                for url in (d.url, None):
                    rows.append(gaps(url, epochs, workers, persistent, args.batch, first, args.step_ms, samples))
                first += epochs
        finally:
            stop_daemon(d)
    print(f"{'loader':<12} {'workers':>7} {'persistent':>10} {'batch ms':>9} {'worst gap / batch':>18}  gaps (ms)")
    for r in rows:
        print(f"{r['loader']:<12} {r['workers']:>7} {str(r['persistent']):>10} {r['batch_ms']:>9.2f} "
              f"{r['worst_gap_in_batches']:>18.2f}  " + ", ".join(f"{g:.1f}" for g in r["gaps_ms"]))
    print("target: worst gap / batch <= 1 (the next manifest and lease are fetched before the epoch ends)")
    print(report.load_note(load_start))
    report.write_report(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
