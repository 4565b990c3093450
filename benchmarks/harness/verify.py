"""Measuring a loader and verifying every pass against the ground truth.

A loader row is a ``Row`` (loader, dataset, workers, batch size, payload per sample, the ``expected`` truth
``{"samples", "y_sum", "x_check"}``). ``measure(row, one_pass, passes, log)`` runs one untimed warm-up pass,
then ``passes`` timed ones; every pass returns a ``Tally`` that must equal the truth, or the pass is marked
failed (``row.verified`` is False). An exception ends the row with ``row.error`` (the other rows still run);
``row.missing`` says a peer or tool was not installed (the row is reported, not failed).

One pass of a loader: ``batches_pass`` (dict batches of torch tensors ``{"x", "y"}``, default_collate's
layout), ``lmdb_scan`` (the raw read-only LMDB limit over a manifest), ``lmdb_check`` (count and sum of y
read back from a cache's LMDB).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from samplecache.format.record import BlockView, Schema, shard_prefix
from samplecache.reading.blocks.reader import _gather_mapped, _Where, open_cache

from .data import MB, Check, Log


@dataclass
class Tally:
    samples: int = 0
    y_sum: int = 0
    x_check: int = 0


@dataclass
class Row:
    loader: str
    dataset: str
    workers: int
    batch_size: int | None
    payload_bytes: int
    expected: dict[str, int]
    times_s: list[float] = field(default_factory=list)
    passes: list[dict[str, Any]] = field(default_factory=list)
    info: bool = False                 # informational row (a reference, not a loader under test)
    error: str | None = None
    missing: str | None = None         # "not installed (...; how to install)": the row could not run here

    @property
    def verified(self) -> bool:
        return self.error is None and self.missing is None and bool(self.passes) and all(p["ok"] for p in self.passes)

    @property
    def status(self) -> str:
        """'not installed' | 'ERROR' | 'yes' | 'NO'."""
        if self.missing:
            return "not installed"
        if self.error:
            return "ERROR"
        return "yes" if self.verified else "NO"

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None

    @property
    def samples_per_s(self) -> float | None:
        m = self.median_s
        return self.expected["samples"] / m if m else None

    @property
    def mb_per_s(self) -> float | None:
        r = self.samples_per_s
        return r * self.payload_bytes / MB if r is not None else None


def measure(row: Row, one_pass: Callable[[], Tally], passes: int, log: Log) -> Row:
    """One untimed warm-up pass, then ``passes`` timed ones; every pass verified."""
    try:
        for i in range(passes + 1):
            t0 = time.perf_counter()
            t = one_pass()
            dt = time.perf_counter() - t0
            got = {"samples": t.samples, "y_sum": t.y_sum, "x_check": t.x_check}
            ok = got == row.expected
            row.passes.append({"warmup": i == 0, "seconds": dt, "ok": ok, **({} if ok else {"got": got})})
            if i > 0:
                row.times_s.append(dt)
            if not ok:
                log(f"  VERIFY FAILED {row.loader} {row.dataset} w={row.workers}: got {got}, expected {row.expected}")
    except Exception as e:  # reported in the table and the JSON; the other rows still run
        fail(row, e, log)
    rate = row.samples_per_s
    log(f"  {row.loader:<11} {row.dataset:<6} w={row.workers} "
        f"{'-' if rate is None else f'{rate:,.0f} samples/s'}  passes {[round(t, 3) for t in row.times_s]}")
    return row


def fail(row: Row, e: BaseException, log: Log, what: str = "") -> Row:
    """``row`` ended by ``e`` (logged)."""
    row.error = f"{what}{type(e).__name__}: {e}"
    log(f"  ERROR {row.loader} {row.dataset} w={row.workers}: {row.error}")
    return row


def batches_pass(batches: Iterable[Any], check: Check, before: Callable[[], None] | None = None) -> Tally:
    """One pass over dict batches ``{"x": (B, width), "y": (B,)}`` of torch tensors."""
    if before is not None:
        before()
    n = ysum = xsum = 0
    for b in batches:
        y = b["y"]
        n += int(y.shape[0])
        ysum += int(y.sum())
        xsum += check.batch(b["x"])
    return Tally(n, ysum, xsum)


def _blocks(manifest: dict[str, Any]) -> Iterable[tuple[int, int, BlockView | None]]:
    """(shard id, rows the manifest says, each block of it; then None) in manifest order, read-only, as the
    client opens the cache."""
    schema = Schema.from_json(manifest["schema"])
    env, db = open_cache(manifest["lmdb_path"], int(manifest["map_size"]), manifest.get("cache_id", ""))
    with env.begin(buffers=True) as txn:
        cur = txn.cursor(db=db)
        for sid, rows, _bytes, _rpb in manifest["shards"]:
            prefix = shard_prefix(sid)
            if cur.set_range(prefix):
                for key, buf in cur:
                    if bytes(key[:8]) != prefix:
                        break
                    yield sid, rows, BlockView(buf, schema)
            yield sid, rows, None


SHUFFLED_CHUNK = 4096  # positions per gather of the shuffled scan (the in-process reader's chunk)


def _shuffled(views: list[BlockView], cx: int, cy: int, check: Check, rng: np.random.Generator) -> tuple[int, int]:
    """(sum of y, checksum of x) of a shard's rows read in a random order: per chunk of positions one vectorised
    gather of x over all the shard's blocks (the reader's own kernel, ``reader._gather_mapped``), nothing else."""
    xs = [v.column_array(cx) for v in views]
    starts = np.cumsum([0] + [v.nrows for v in views])
    order = rng.permutation(int(starts[-1]))
    ysum = sum(int(v.column_array(cy).sum()) for v in views)
    xsum = 0
    out = np.empty((min(SHUFFLED_CHUNK, len(order)),) + xs[0].shape[1:], xs[0].dtype)
    for a in range(0, len(order), SHUFFLED_CHUNK):
        pos = order[a:a + SHUFFLED_CHUNK]
        block = np.searchsorted(starts, pos, side="right") - 1
        at = _Where(list(range(len(xs))), block, pos - starts[block])
        dst = out[:len(pos)]
        if not _gather_mapped(xs, dst, at):
            raise RuntimeError("the shard's blocks cannot be gathered in one map")
        xsum += check.block(dst)
    return ysum, xsum


def lmdb_scan(manifest: dict[str, Any], per_sample: bool, check: Check, shuffled: bool = False) -> Tally:
    """The raw read: shard by shard of the manifest, every block, x copied once per sample (``per_sample``,
    the limit) or once per block; ``shuffled``: each shard's rows in a random order, gathered by the reader's
    vectorised kernel alone (the ceiling of a shuffled read: the same memory access, no batching or Python per
    batch); each shard's row count checked against the manifest."""
    schema = Schema.from_json(manifest["schema"])
    cx, cy = schema.index("x"), schema.index("y")
    n = ysum = xsum = got = 0
    sample = check.sample
    rng, views = np.random.default_rng(0), []
    for sid, rows, view in _blocks(manifest):
        if view is None:
            if got != rows:
                raise RuntimeError(f"shard {sid}: {got} rows in LMDB, manifest says {rows}")
            if views:
                ys, xc = _shuffled(views, cx, cy, check, rng)
                ysum, xsum, views = ysum + ys, xsum + xc, []
            n, got = n + got, 0
            continue
        got += view.nrows
        if shuffled:
            views.append(view)
            continue
        xs, ys = view.column_array(cx), view.column_array(cy)
        if per_sample:
            for x, y in zip(xs, ys.tolist()):
                x = x.copy()
                ysum += y
                xsum += sample(x)
        else:
            xs = xs.copy()
            ysum += int(ys.sum())
            xsum += check.block(xs)
    return Tally(n, ysum, xsum)


def lmdb_check(manifest: dict[str, Any], release: bool = False) -> tuple[int, int]:
    """(samples, sum of y) read back from the cache's LMDB over the manifest's shards. ``release``: close this
    process's handle on it afterwards (before the cache directory is removed or rebuilt)."""
    cy = Schema.from_json(manifest["schema"]).index("y")
    n = ysum = 0
    for _sid, _rows, view in _blocks(manifest):
        if view is not None:
            ysum += int(view.column_array(cy).sum())
            n += view.nrows
    if release:
        release_cache(manifest["lmdb_path"])
    return n, ysum


def release_cache(lmdb_path: str) -> None:
    """Close this process's read-only handle on the cache at ``lmdb_path`` (``samplecache.reading.blocks.reader``'s)."""
    from samplecache.reading.blocks import reader
    got = reader._ENVS.pop(lmdb_path, None)
    if got is not None:
        got[1].close()
