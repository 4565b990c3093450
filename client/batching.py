"""Columnar batches of one reader's stream: which positions are read together, and how far ahead (no framework).

Small batches are read about a chunk at a time by one read-ahead thread (``prefetch.prefetched``), each batch a
view of the chunk's arrays. Large ones (``BATCH_ALONE_BYTES`` and up) are read in groups of whole batches of about
``GROUP_BYTES`` (one batch of 1 MiB samples x 8), one task per group (``prefetch.read_ahead``): ``threads - 1``
groups are handed to the read-ahead threads ahead of the one the consumer waits for, each copied from start to end
by one thread, and a group no thread has started when the consumer needs it is read by the consumer itself. On
free cores the groups are read in parallel and ahead of the training step; on a busy machine the reading costs
what it would cost inline, with no hand-off per batch to wait for (measured in docs/benchmarks.md, "In-process
feed"). Few groups in flight also keep the output buffers few, so they are still in the CPU's cache when written.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator

import numpy as np

from samplecache.epoch_source import EpochPlan
from samplecache.prefetch import prefetched, read_ahead
from samplecache.stream import Stream

AHEAD_BYTES = 8 << 20  # read ahead by the prefetch thread, beyond one chunk or batch
BATCH_ALONE_BYTES = 1 << 20  # a batch at least this large is read in groups of whole batches (or on its own)
GROUP_BYTES = 8 << 20  # large batches are read this much at a time, whole batches (one task, one output buffer)

Make = Callable[[EpochPlan, np.ndarray, np.ndarray, int], Iterator[tuple[int, Any]]]


def batch_groups(plan: EpochPlan, stream: Stream, start: int, batch: int, unit: int, drop_last: bool,
                 group_bytes: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """``stream.batch_groups`` from ``start``: small batches read together (about a chunk at a time), large
    ones about ``group_bytes`` at a time (whole batches; by default one by one)."""
    size = batch * plan.sample_bytes
    per_chunk = max(1, plan.chunk // batch) if size < BATCH_ALONE_BYTES else max(1, group_bytes // size)
    return stream.batch_groups(start, batch, unit, max(unit, per_chunk * batch // unit * unit), drop_last)


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
                make: Make, prefetch: int, threads: int) -> Iterator[tuple[int, Any]]:
    """(samples, item) from ``make(plan, index, rows, unit)`` over the stream's groups from ``start``, read ahead
    of the consumer when ``prefetch`` > 0: large batches (with ``threads`` > 1) as groups on the read-ahead
    threads, others up to ``prefetch`` items ahead by one thread."""
    if batch * plan.sample_bytes >= BATCH_ALONE_BYTES and prefetch > 0 and threads > 1:
        groups = batch_groups(plan, stream, start, batch, unit, drop_last, GROUP_BYTES)
        tasks = (partial(_listed, make, plan, i, r, u) for i, r, u in groups)
        return _flat(read_ahead(tasks, max(1, threads - 1)))
    groups = batch_groups(plan, stream, start, batch, unit, drop_last)
    return prefetched((x for i, r, u in groups for x in make(plan, i, r, u)),
                      ahead(prefetch, batch * plan.sample_bytes))


def _listed(make: Make, plan: EpochPlan, idx: np.ndarray, rows: np.ndarray, unit: int) -> list[tuple[int, Any]]:
    return list(make(plan, idx, rows, unit))


def _flat(lists: Iterator[list[Any]]) -> Iterator[Any]:
    try:
        for items in lists:
            yield from items
    finally:
        lists.close()  # type: ignore[attr-defined]


__all__ = ["AHEAD_BYTES", "BATCH_ALONE_BYTES", "GROUP_BYTES", "batch_groups", "gather_batches", "ahead",
           "batch_items"]
