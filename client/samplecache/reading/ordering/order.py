"""An epoch's one global order: which (shard, row) is at each position. Topology-free.

Defined by the manifest, the seed and the epoch only (world size and workers play no part): the shards in a
seeded order, each shard's rows in a seeded order (so a batch of neighbouring positions reads one or two shards:
LMDB locality), then, with ``window`` > 1, every window of that many positions permuted (seeded by the window's
index): a sample moves by less than one window. Positions past the end wrap (padding repeats the start).
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from typing import Callable, Protocol

import numpy as np

from samplecache.reading.ordering.partition import row_order, shard_order

CACHED_ORDERS = 256  # shard row orders (and windows) kept: readers sweep the order, so recent ones are reused
_KEPT_LOCK = threading.Lock()  # the caches' own bookkeeping (get, move, evict), never held while a value is made


def kept(cache: OrderedDict[int, np.ndarray], key: int, make: Callable[[], np.ndarray],
         most: int = CACHED_ORDERS) -> np.ndarray:
    """``cache[key]``, made by ``make()`` when missing; the cache keeps the ``most`` last used. Thread-safe: a
    read-ahead thread and the caller share an order (two threads may both make a missing value: it is the same)."""
    with _KEPT_LOCK:
        got = cache.get(key)
        if got is not None:
            cache.move_to_end(key)
            return got
    got = make()  # outside the lock: a row order takes ~0.2 ms, and no other cache waits for it
    with _KEPT_LOCK:
        cache[key] = got
        cache.move_to_end(key)
        while len(cache) > most:
            cache.popitem(last=False)
    return got


def joined(runs: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(manifest index, row) arrays of (index, rows) runs."""
    if not runs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.concatenate([r for _, r in runs]).astype(np.int64, copy=False)
    return np.repeat(np.array([i for i, _ in runs], np.int64), [len(r) for _, r in runs]), rows


class GlobalOrder(Protocol):
    """What a stream reads an epoch's order through (``EpochOrder``, ``mixture.MixedOrder``)."""

    total: int
    window: int
    spread: int  # shards neighbouring positions read in turn (a mixture: its sources; 1: runs, shard by shard)

    def __len__(self) -> int: ...

    def warm(self) -> None: ...

    def runs(self, a: int, b: int, out: list[tuple[int, np.ndarray]]) -> None: ...

    def span(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]: ...

    def positions(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class EpochOrder:
    """Global position -> (manifest index, row) for one epoch of one manifest."""

    spread = 1

    def __init__(self, ids: np.ndarray, rows: np.ndarray, seed: int, epoch: int, shuffle: bool,
                 window: int = 0) -> None:
        self.ids, self.rows = ids, rows
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self.window = int(window) if shuffle and window > 1 else 0
        self.order = shard_order(len(ids), seed, epoch, shuffle)
        self.ordered = rows[self.order].astype(np.int64, copy=False)
        self.ends = np.cumsum(self.ordered)
        self.total = int(self.ends[-1]) if len(self.ends) else 0
        # the same as Python ints, for the per-run walk (bisect on a list beats a numpy call per run)
        self._ends, self._sizes, self._indices = self.ends.tolist(), self.ordered.tolist(), self.order.tolist()
        self._rows: OrderedDict[int, np.ndarray] = OrderedDict()
        self._windows: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return self.total

    def _row_order(self, index: int) -> np.ndarray:
        return kept(self._rows, index, lambda: row_order(int(self.ids[index]), int(self.rows[index]),
                                                                 self.seed, self.epoch, True))

    def _windowed(self, g: np.ndarray) -> np.ndarray:
        w = self.window
        win = g // w
        out = np.empty_like(g)
        for i in np.unique(win).tolist():
            size = min(w, self.total - i * w)
            perm = kept(self._windows, i, lambda: np.random.default_rng(
                [self.seed & 0xFFFFFFFF, self.epoch, 2, i]).permutation(size))
            sel = win == i
            out[sel] = i * w + perm[g[sel] - i * w]
        return out

    def warm(self) -> None:
        """Make the first shard's row order now (ahead of the epoch: its first batch needs it)."""
        if self.shuffle and self.total:
            self._row_order(int(self.order[0]))

    def runs(self, a: int, b: int, out: list[tuple[int, np.ndarray]]) -> None:
        """Append the positions [a, b) to ``out`` as (manifest index, rows) runs, shard by shard (no per-position
        search): the common case, a batch or a run of batches of neighbouring positions. No window shuffle."""
        pos = a
        while pos < b:
            g = pos % self.total
            k = bisect_right(self._ends, g)
            lo = g - (self._ends[k] - self._sizes[k])
            take = min(self._sizes[k] - lo, b - pos)
            index = self._indices[k]
            out.append((index, self._row_order(index)[lo:lo + take] if self.shuffle else np.arange(lo, lo + take)))
            pos += take

    def span(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(manifest index, row) of the positions [a, b)."""
        if self.window or self.total == 0:
            return self.positions(np.arange(a, b, dtype=np.int64))
        got: list[tuple[int, np.ndarray]] = []
        self.runs(a, b, got)
        return joined(got)

    def positions(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(manifest index, row) arrays of global positions ``g`` (int64; past the end: wrapped)."""
        if self.total == 0 or len(g) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        g = np.asarray(g, dtype=np.int64) % self.total
        if self.window:
            g = self._windowed(g)
        k = np.searchsorted(self.ends, g, side="right")
        idx = self.order[k].astype(np.int64, copy=False)
        off = g - (self.ends[k] - self.ordered[k])
        if not self.shuffle:
            return idx, off
        rows = np.empty_like(off)
        # neighbouring positions share a shard: one row order per run of equal shards (sorted first when the
        # window shuffle scattered them)
        sort = None if self.window == 0 else np.argsort(k, kind="stable")
        ks = k if sort is None else k[sort]
        cuts = np.flatnonzero(np.diff(ks)) + 1
        for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(k)].tolist()):
            sel = slice(a, b) if sort is None else sort[a:b]
            rows[sel] = self._row_order(int(self.order[ks[a]]))[off[sel]]
        return idx, rows


__all__ = ["EpochOrder", "GlobalOrder", "joined", "kept"]
