"""``samplecache demo``: the whole loop on one machine, with nothing to download.

It writes a small learnable Parquet dataset into a local directory that stands
in for the remote store, starts the daemon on it, and trains a small model
through ``SampleCacheDataset`` for a few epochs while the cache grows.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn
from torch.utils.data import DataLoader

from samplecache.pytorch.dataset import SampleCacheDataset
from samplecache_tools.launch import DaemonProcess

FEATURES = 16
CLASSES = 4


def _centers(seed: int = 1234) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 0.5, size=(CLASSES, FEATURES)).astype(np.float32)


def make_examples(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters: learnable, but not trivially (the clusters overlap a little)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n)
    x = _centers()[y] + rng.normal(0.0, 1.0, size=(n, FEATURES)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


def write_dataset(directory: Path, files: int = 48, rows_per_file: int = 5000, row_group: int = 500) -> int:
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
    with urllib.request.urlopen(url + "/v1/status", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def train(url: str, epochs: int = 4, batch_size: int = 256, workers: int = 2, seed: int = 0,
          min_samples: int = 2000, lr: float = 3e-3) -> list[dict[str, Any]]:
    """Train the demo model through the cache at ``url``; returns one record per epoch."""
    torch.manual_seed(seed)
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    val_x, val_y = (torch.from_numpy(a) for a in make_examples(4000, seed=10_000))
    ds = SampleCacheDataset(url, columns=["features", "label"], seed=seed, min_samples=min_samples)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)
    history = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        plan = ds.plan(epoch)
        net.train()
        seen, correct, loss_sum = 0, 0, 0.0
        bar = Progress(f"epoch {epoch}", plan.total)
        t0 = time.perf_counter()
        for batch in loader:
            x, y = batch["features"], batch["label"]
            out = net(x)
            loss = loss_fn(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += len(y)
            correct += int((out.argmax(1) == y).sum())
            loss_sum += float(loss.detach()) * len(y)
            bar.update(len(y), f"loss {loss_sum / seen:.3f}")
        bar.close()
        seconds = time.perf_counter() - t0
        net.eval()
        with torch.no_grad():
            val_acc = float((net(val_x).argmax(1) == val_y).float().mean())
        cached = status(url)["samples"]
        rec = {"epoch": epoch, "epoch_samples": plan.total, "new_samples": plan.manifest.get("new_samples", 0),
               "cache_samples_now": cached, "trained": seen, "loss": loss_sum / max(1, seen),
               "train_acc": correct / max(1, seen), "val_acc": val_acc, "samples_per_s": seen / max(1e-9, seconds)}
        history.append(rec)
        print(f"epoch {epoch}: epoch sample {plan.total} (+{rec['new_samples']} new), cache now {cached}, "
              f"trained {seen}, loss {rec['loss']:.3f}, train acc {rec['train_acc']:.3f}, "
              f"val acc {val_acc:.3f}, {rec['samples_per_s']:,.0f} samples/s", flush=True)
    del loader  # its workers stop
    ds.close()  # and the leases go now, not after the TTL
    return history


def run_demo(epochs: int = 4, workdir: str | None = None, port: int = 0) -> int:
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="samplecache-demo-"))
    remote = root / "remote"
    print(f"samplecache demo: writing the embedded dataset to {remote} (it stands in for s3://...)", flush=True)
    rows = write_dataset(remote)
    print(f"samplecache demo: {rows} rows; starting the daemon with 1 sampler so the cache grows while we train",
          flush=True)
    daemon = DaemonProcess(f"file://{remote}", root / "cache", port=port or None,
                           extra=["--samplers", "1", "--max-bytes", "1GiB"], log_path=root / "daemon.log")
    try:
        daemon.start()
        print(f"samplecache demo: daemon at {daemon.url} (log: {daemon.log_path})", flush=True)
        history = train(daemon.url, epochs=epochs)
    finally:
        code = daemon.stop()
        print(f"samplecache demo: daemon stopped (exit code {code})", flush=True)
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    final = history[-1]
    print(f"samplecache demo: done. The epoch sample grew from {history[0]['epoch_samples']} to "
          f"{final['epoch_samples']} samples; validation accuracy {final['val_acc']:.3f}.", flush=True)
    return 0 if final["val_acc"] > 0.7 else 1
