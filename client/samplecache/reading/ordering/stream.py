"""One worker's stream of samples for an epoch (a rank, or one of its DataLoader workers): which (shard, row) is next.

Built from the epoch's global order (``order.py``) and the batches this rank x worker is dealt from it
(``deal.py``): the stream is those batches' positions, in order. Everything depends only on (manifest, seed,
epoch) for the order and on (position, world size, batch, workers) for the deal, so a resume at a position
deals the rest of the order anew to whatever topology resumes it.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from samplecache.reading.ordering.order import GlobalOrder, joined

DEFAULT_CHUNK = 4096
FEW_RANGES = 32  # a chunk over fewer ranges reads each as a run; more (single samples dealt apart): vectorised


class Stream:
    """Positions of one worker's samples, produced in chunks of (manifest index, row) arrays."""

    def __init__(self, order: GlobalOrder, batches: np.ndarray) -> None:
        """``batches``: (n, 2) [a, b) ranges of the order, read one after the other."""
        self.order = order
        if len(batches) > 1:
            # one range for batches that follow each other (a single rank's): fewer ranges to search
            joined = np.flatnonzero(batches[1:, 0] != batches[:-1, 1]) + 1
            starts, stops = np.r_[0, joined], np.r_[joined, len(batches)] - 1
            batches = np.stack([batches[starts, 0], batches[stops, 1]], axis=1)
        self.starts = batches[:, 0].astype(np.int64, copy=False)
        self.lengths = (batches[:, 1] - batches[:, 0]).astype(np.int64, copy=False)
        self.ends = np.cumsum(self.lengths)
        self.total = int(self.ends[-1]) if len(self.ends) else 0

    def __len__(self) -> int:
        return self.total

    def global_ranges(self, start: int, stop: int) -> np.ndarray:
        """(k, 2) [a, b) ranges of the epoch's global order that stream positions [start, stop) read, in order."""
        start, stop = max(0, start), min(stop, self.total)
        if stop <= start:
            return np.zeros((0, 2), np.int64)
        first, last = np.searchsorted(self.ends, [start, stop - 1], side="right").tolist()
        got = np.stack([self.starts[first:last + 1], self.starts[first:last + 1] + self.lengths[first:last + 1]], 1)
        got[0, 0] += start - int(self.ends[first] - self.lengths[first])
        got[-1, 1] -= int(self.ends[last]) - stop
        return got

    def _positions(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(manifest index, row) of stream positions [start, stop)."""
        if stop <= start:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        first, last = np.searchsorted(self.ends, [start, stop - 1], side="right").tolist()
        if first == last and self.order.spread > 1:
            # one range of a mixture (a single rank's stream): its sources' runs, not a position at a time
            begin = int(self.ends[first] - self.lengths[first])
            base = int(self.starts[first])
            return self.order.span(base + start - begin, base + stop - begin)
        if last - first < FEW_RANGES and not self.order.window and self.order.spread == 1 and self.order.total:
            # a few ranges (batches of neighbouring positions): each read shard by shard, as contiguous runs
            got: list[tuple[int, np.ndarray]] = []
            near = slice(first, last + 1)
            for base, length, end in zip(self.starts[near].tolist(), self.lengths[near].tolist(),
                                         self.ends[near].tolist()):
                begin = end - length
                self.order.runs(base + max(start, begin) - begin, base + min(stop, end) - begin, got)
            return joined(got)
        s = np.arange(start, stop, dtype=np.int64)
        k = np.searchsorted(self.ends, s, side="right")
        return self.order.positions(self.starts[k] + s - (self.ends[k] - self.lengths[k]))

    def chunks(self, start: int = 0, chunk: int = DEFAULT_CHUNK, first: int | None = None
               ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Chunks of the stream from position ``start`` on. ``first`` makes the first chunk smaller, so the
        first batch of an epoch does not wait for a whole chunk."""
        if first is not None and first < chunk and start < self.total:
            head = min(self.total, start + first)
            yield self._positions(start, head)
            start = head
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
