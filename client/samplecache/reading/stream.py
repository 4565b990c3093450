"""One worker's stream of samples for an epoch (a rank, or one of its DataLoader workers): which (shard, row) is next.

Built from the spans this rank x worker owns (``partition.py``), each shard's
row order, and an optional bounded shuffle: the stream is cut into windows of
``shuffle_buffer`` positions and each window is permuted (seeded), so a sample
moves by less than one window and memory stays bounded. Everything depends only
on (manifest, seed, epoch, world size, workers): resuming at position k
regenerates the same stream and starts at k.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from samplecache.reading.partition import Span, row_order

DEFAULT_CHUNK = 4096


class Stream:
    """Positions of one worker's samples, produced in chunks of (manifest index, row) arrays."""

    def __init__(self, spans: Sequence[Span], shard_ids: np.ndarray, shard_rows: np.ndarray, seed: int,
                 epoch: int, shuffle: bool, shuffle_buffer: int = 0, key: int = 0) -> None:
        self.spans = list(spans)
        self.ids, self.rows = shard_ids, shard_rows
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self.window = int(shuffle_buffer) if shuffle and shuffle_buffer > 1 else 0
        self.key = key  # tells workers apart for the window shuffle (rank * workers + worker)
        self.lengths = np.array([len(s) for s in self.spans], dtype=np.int64)
        self.ends = np.cumsum(self.lengths)
        self.total = int(self.ends[-1]) if len(self.ends) else 0
        self._order_of: tuple[int, np.ndarray] | None = None  # the last shard's row order

    def _row_order(self, index: int) -> np.ndarray:
        """A shard's row order, kept while its spans are read (they are consecutive in a stream)."""
        if self._order_of is None or self._order_of[0] != index:
            sid = int(self.ids[index])
            self._order_of = (index, row_order(sid, int(self.rows[index]), self.seed, self.epoch, self.shuffle))
        return self._order_of[1]

    def __len__(self) -> int:
        return self.total

    def _positions(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(manifest index, row) of stream positions [start, stop), before the window shuffle."""
        idx_parts, row_parts = [], []
        k = int(np.searchsorted(self.ends, start, side="right"))
        pos = start
        while pos < stop and k < len(self.spans):
            span = self.spans[k]
            span_start = int(self.ends[k] - self.lengths[k])
            lo, hi = pos - span_start, min(stop, int(self.ends[k])) - span_start
            order = self._row_order(span.index)
            row_parts.append(order[span.start + lo:span.start + hi])
            idx_parts.append(np.full(hi - lo, span.index, dtype=np.int64))
            pos = span_start + hi
            k += 1
        if not idx_parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(idx_parts), np.concatenate(row_parts).astype(np.int64, copy=False)

    def chunks(self, start: int = 0, chunk: int = DEFAULT_CHUNK, first: int | None = None
               ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Chunks of the stream from position ``start`` on (the resume point). ``first`` makes the
        first chunk smaller, so the first batch of an epoch does not wait for a whole chunk."""
        if first is not None and first < chunk and not self.window and start < self.total:
            head = min(self.total, start + first)
            yield self._positions(start, head)
            start = head
        if self.window:
            w = self.window
            first = start // w
            for i in range(first, -(-self.total // w)):
                a, b = i * w, min(self.total, (i + 1) * w)
                idx, rows = self._positions(a, b)
                perm = np.random.default_rng([self.seed & 0xFFFFFFFF, self.epoch, 2, self.key, i]).permutation(b - a)
                idx, rows = idx[perm], rows[perm]
                skip = start - a if i == first else 0
                for c in range(skip, b - a, chunk):
                    yield idx[c:c + chunk], rows[c:c + chunk]
            return
        for a in range(start, self.total, chunk):
            yield self._positions(a, min(self.total, a + chunk))

    def batch_groups(self, start: int, batch: int, unit: int, chunk: int, drop_last: bool
                     ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """(manifest index, row, unit) groups of positions from ``start``, read ``chunk`` at a time: whole
        units of ``unit`` positions (``batch`` times the batches packed in one item), then the whole batches
        left over as one unit, then the short batch (unless ``drop_last``)."""
        pend_idx: list[np.ndarray] = []
        pend_rows: list[np.ndarray] = []
        pending = 0
        for idx, rows in self.chunks(start, chunk=chunk, first=unit):
            pend_idx.append(idx)
            pend_rows.append(rows)
            pending += len(idx)
            if pending < unit:
                continue
            all_idx, all_rows = np.concatenate(pend_idx), np.concatenate(pend_rows)
            full = len(all_idx) // unit * unit
            yield all_idx[:full], all_rows[:full], unit
            pend_idx, pend_rows, pending = [all_idx[full:]], [all_rows[full:]], len(all_idx) - full
        if pending:
            idx, rows = np.concatenate(pend_idx), np.concatenate(pend_rows)
            whole = len(idx) // batch * batch
            if whole:
                yield idx[:whole], rows[:whole], whole
            if whole < len(idx) and not drop_last:
                yield idx[whole:], rows[whole:], len(idx) - whole
