"""Columnar batches of one worker's stream: which positions are read together, and how far ahead (no framework).

Small batches are read about a chunk at a time, each batch a view of the chunk's arrays; large ones
(``BATCH_ALONE_BYTES`` and up) one by one, so each is written into memory the consumer just freed (still in the
CPU's cache: the same copies into one reused 8 MiB buffer cost 0.40 s for 3 GB here, into 64 MiB of rotating
buffers 0.52 s). A read-ahead thread (``prefetch.prefetched``) keeps up to ``AHEAD_BYTES`` beyond one item ready;
a large batch's copies are split over threads by ``gather.copy_all``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from samplecache.reading.epoch_source import EpochPlan
from samplecache.reading.ordering.stream import Stream
from samplecache.reading.prefetch import prefetched_groups

AHEAD_BYTES = 8 << 20  # read ahead by the prefetch thread, beyond one chunk or batch
BATCH_ALONE_BYTES = 1 << 20  # a batch at least this large is gathered on its own

Make = Callable[[EpochPlan, np.ndarray, np.ndarray, int], Iterator[tuple[int, Any]]]


def group_samples(plan: EpochPlan, batch: int, unit: int, spread: int = 1) -> int:
    """Positions read together: small batches about a chunk at a time (``plan.read_chunk(spread)``), large ones
    one unit at a time (so each is written into memory the consumer just freed, still in the CPU's cache)."""
    per_chunk = max(1, plan.read_chunk(spread) // batch) if batch * plan.sample_bytes < BATCH_ALONE_BYTES else 1
    return max(unit, per_chunk * batch // unit * unit)


def batch_groups(plan: EpochPlan, stream: Stream, start: int, batch: int, unit: int, drop_last: bool
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """``stream.batch_groups`` from ``start``, ``group_samples`` positions at a time."""
    return stream.batch_groups(start, batch, unit, group_samples(plan, batch, unit, stream.order.spread), drop_last)


def gather_batches(plan: EpochPlan, idx: np.ndarray, rows: np.ndarray, batch: int, threads: int = 1,
                   masks: bool = True, alloc: Any = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(samples, batch) for these positions: one vectorised gather (into ``alloc``'s arrays), batches views of it."""
    got = plan.reader.batch(plan.ids[idx], plan.rows_per_block[idx], rows, plan.cols, alloc, threads, masks)
    for a in range(0, len(idx), batch):
        yield min(batch, len(idx) - a), {k: v[a:a + batch] for k, v in got.items()}


def ahead(depth: int, item_bytes: int) -> int:
    """Items read ahead by a thread: ``depth``, but no more than ``AHEAD_BYTES`` beyond one item (memory the
    consumer just freed is reused while it is still in the CPU's cache); 0: none."""
    return 0 if depth <= 0 else max(1, min(depth, AHEAD_BYTES // max(1, item_bytes)))


def batch_items(plan: EpochPlan, stream: Stream, start: int, batch: int, unit: int, drop_last: bool,
                make: Make, prefetch: int) -> Iterator[tuple[int, Any]]:
    """(samples, item) from ``make(plan, index, rows, unit)`` over the stream's groups from ``start``, up to
    ``prefetch`` items read ahead by a thread (0: in the caller's). The thread hands over a group's items at
    once: one hand-over per group, not per batch (each costs the consumer tens of microseconds)."""
    groups = batch_groups(plan, stream, start, batch, unit, drop_last)
    if prefetch <= 0:
        return (x for i, r, u in groups for x in make(plan, i, r, u))
    depth = ahead(prefetch, min(group_samples(plan, batch, unit, stream.order.spread), max(1, len(stream)))
                  * plan.sample_bytes)
    return prefetched_groups((make(plan, i, r, u) for i, r, u in groups), depth)


__all__ = ["AHEAD_BYTES", "BATCH_ALONE_BYTES", "batch_groups", "group_samples", "gather_batches", "ahead",
           "batch_items"]
