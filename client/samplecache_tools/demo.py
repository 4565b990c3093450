"""``samplecache demo``: the whole loop on one machine, with nothing to download.

It writes a small learnable Parquet dataset into a local directory that stands in for the remote store, starts the
daemon on it with a budget of about a third of the dataset, and trains a small model through
``SampleCacheDataset``: the cache fills, then rolls (old shards evicted for new ones, a share per epoch). Each epoch
prints one line of what it trained on; at the end a chart of the epochs is written beside the daemon's log.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn
from torch.utils.data import DataLoader

from samplecache.api.client import request_json
from samplecache.pytorch.dataset import SampleCacheDataset
from samplecache.reading.epoch_source import EpochPlan
from samplecache_tools import demo_chart
from samplecache_tools.launch import DaemonProcess

FEATURES = 16
CLASSES = 4
# The embedded dataset caches in about 12.5 MB (120,000 samples of ~100 bytes): this budget holds a third of it, so
# the cache fills, then rolls while the epochs go by
BUDGET = "4MiB"
EPOCHS = 8


def _centers(seed: int = 1234) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 0.5, size=(CLASSES, FEATURES)).astype(np.float32)


def make_examples(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters: learnable, but not trivially (the clusters overlap a little)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n)
    x = _centers()[y] + rng.normal(0.0, 1.0, size=(n, FEATURES)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


def write_dataset(directory: Path, files: int = 24, rows_per_file: int = 5000, row_group: int = 500) -> int:
    """The embedded dataset: ``files`` Parquet files of features (16 x float32), label and a caption."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        x, y = make_examples(rows_per_file, seed=f)
        table = pa.table({
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES),
            "label": pa.array(y),
            "caption": pa.array([f"file {f} row {i} class {c}" for i, c in enumerate(y)]),
        })
        pq.write_table(table, directory / f"part-{f:05d}.parquet", row_group_size=row_group)
    return files * rows_per_file


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.n, self.t0, self.last = label, max(1, total), 0, time.perf_counter(), 0.0

    def update(self, k: int, note: str = "") -> None:
        self.n += k
        now = time.perf_counter()
        if now - self.last < 0.1 and self.n < self.total:
            return
        self.last = now
        frac = min(1.0, self.n / self.total)
        bar = "#" * int(30 * frac)
        rate = self.n / max(1e-9, now - self.t0)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.n}/{self.total} {rate:,.0f} samples/s {note}   ")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")


def status(url: str) -> dict[str, Any]:
    got: dict[str, Any] = request_json(url + "/v1/status", what="daemon status")  # retried, as the client's calls
    return got


def new_samples(previous: EpochPlan | None, plan: EpochPlan) -> int:
    """Samples of ``plan`` that the job's previous epoch did not train on: none when both read the same daemon
    epoch (the daemon reuses a sealed epoch while nothing changed), all of them in the job's first epoch."""
    if previous is None:
        return plan.total
    if previous.daemon_epoch == plan.daemon_epoch:
        return 0
    fresh = ~np.isin(plan.ids, previous.ids)
    return int(plan.rows[fresh].sum())


@dataclass(frozen=True)
class EpochLine:
    """What one job epoch trained on, and how the model did."""

    epoch: int
    daemon_epoch: int  # the sealed daemon epoch it read (job epochs reuse one while the cache did not change)
    samples: int
    new: int  # samples the job's previous epoch did not have
    evicted: int  # shards the daemon evicted since the previous epoch ended
    coverage: float | None  # the daemon's coverage of the remote: fraction of its rows sampled at least once
    cache_samples: int  # samples in the cache when the epoch ended
    seen: int  # distinct samples the job trained on so far, this epoch's included
    trained: int
    loss: float
    train_acc: float
    val_acc: float
    samples_per_s: float

    def text(self) -> str:
        new = (f"+0 new: daemon epoch {self.daemon_epoch} again" if self.new == 0 and self.epoch > 0
               else f"+{self.new:,} new")
        cov = "unknown" if self.coverage is None else f"{self.coverage:.0%}"
        shards = "shard" if self.evicted == 1 else "shards"
        return (f"epoch {self.epoch}: {self.samples:,} samples ({new}), {self.evicted} {shards} evicted, "
                f"remote covered {cov}, val acc {self.val_acc:.3f} (loss {self.loss:.3f}, "
                f"{self.samples_per_s:,.0f} samples/s)")


def train(url: str, epochs: int = EPOCHS, batch_size: int = 256, workers: int = 2, seed: int = 0,
          min_samples: int = 2000, lr: float = 3e-3) -> list[EpochLine]:
    """Train the demo model through the cache at ``url``; prints and returns one line per epoch."""
    torch.manual_seed(seed)
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    val_x, val_y = (torch.from_numpy(a) for a in make_examples(4000, seed=10_000))
    ds = SampleCacheDataset(url, columns=["features", "label"], seed=seed, min_samples=min_samples)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)
    history: list[EpochLine] = []
    previous: EpochPlan | None = None
    evictions = status(url)["evictions"]
    trained_shards: dict[int, int] = {}  # shard id -> samples, over every epoch so far
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        plan = ds.plan(epoch)
        net.train()
        trained, correct, loss_sum = 0, 0, 0.0
        bar = Progress(f"epoch {epoch}", plan.total)
        t0 = time.perf_counter()
        for batch in loader:
            x, y = batch["features"], batch["label"]
            out = net(x)
            loss = loss_fn(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            trained += len(y)
            correct += int((out.argmax(1) == y).sum())
            loss_sum += float(loss.detach()) * len(y)
            bar.update(len(y), f"loss {loss_sum / trained:.3f}")
        bar.close()
        seconds = time.perf_counter() - t0
        net.eval()
        with torch.no_grad():
            val_acc = float((net(val_x).argmax(1) == val_y).float().mean())
        st = status(url)
        trained_shards.update(zip(plan.ids.tolist(), plan.rows.tolist()))
        line = EpochLine(epoch=epoch, daemon_epoch=plan.daemon_epoch, samples=plan.total,
                         new=new_samples(previous, plan), evicted=st["evictions"] - evictions,
                         coverage=(st.get("coverage") or {}).get("row_fraction"), cache_samples=st["samples"],
                         seen=sum(trained_shards.values()), trained=trained, loss=loss_sum / max(1, trained),
                         train_acc=correct / max(1, trained), val_acc=val_acc,
                         samples_per_s=trained / max(1e-9, seconds))
        history.append(line)
        print(line.text(), flush=True)
        previous, evictions = plan, st["evictions"]
    del loader  # its workers stop
    ds.close()  # and the leases go now, not after the TTL
    return history


def run_demo(epochs: int = EPOCHS, workdir: str | None = None, port: int = 0) -> int:
    """The demo; without ``workdir``, a temp dir that keeps only the daemon's log and the chart at the end."""
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="samplecache-demo-"))
    remote = root / "remote"
    print(f"samplecache demo: writing the embedded dataset to {remote} (it stands in for s3://...)", flush=True)
    rows = write_dataset(remote)
    print(f"samplecache demo: {rows:,} rows; the daemon caches at most {BUDGET} of them (about a third) with 1 "
          f"sampler, so the cache fills, then rolls while we train", flush=True)
    daemon = DaemonProcess(f"file://{remote}", root / "cache", port=port or None,
                           extra=["--samplers", "1", "--max-bytes", BUDGET], log_path=root / "daemon.log")
    history: list[EpochLine] = []
    try:
        daemon.start()
        print(f"samplecache demo: daemon at {daemon.url} (status page: {daemon.url}/ while it runs)", flush=True)
        history = train(daemon.url, epochs=epochs)
    finally:
        code = daemon.stop()
        print(f"samplecache demo: daemon stopped (exit code {code})", flush=True)
        if workdir is None:  # the data and the cache go; the log and the chart stay
            shutil.rmtree(remote, ignore_errors=True)
            shutil.rmtree(root / "cache", ignore_errors=True)
    print(f"samplecache demo: daemon log: {daemon.log_path}", flush=True)
    chart = root / "samplecache-demo.png"
    why = demo_chart.missing()
    if why is None:
        demo_chart.draw(history, rows, f"samplecache demo: {rows:,} remote samples, a cache of {BUDGET}", chart)
    print(f"samplecache demo: no chart ({why})" if why else f"samplecache demo: chart of the epochs: {chart}",
          flush=True)
    final = history[-1]
    print(f"samplecache demo: done. Training saw {final.seen:,} distinct samples of {rows:,} over {len(history)} "
          f"epochs with a cache of at most {max(h.cache_samples for h in history):,}; "
          f"{sum(h.evicted for h in history)} shards were evicted; validation accuracy {final.val_acc:.3f}.",
          flush=True)
    return 0 if final.val_acc > 0.7 else 1
