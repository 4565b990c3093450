"""An epoch's one global order over a mixture of named sources, with exact per-source counts. Topology-free.

A manifest's shards belong to sources ("web", "code", ...) and a job asks for weights. Each weighted source gets
its own ``EpochOrder`` over its shards (its own seed, from the job's seed and the source's name), and the epoch
holds exactly ``apportion(N, weights)`` samples of each (``apportion.py``): the first ``n_s`` positions of the
source's order, taken modulo its length when it is upsampled (so every sample is read floor or ceil of
``n_s / T_s`` times, the seeded order choosing which get the extra read). A label per global position says which
source it reads; position ``g`` labelled ``s`` reads that source's ``j``-th position, ``j`` the positions before
``g`` labelled ``s``. The labels:

* ``"random"``: a uniformly random arrangement with exactly ``n_s`` of each label (also when ``shuffle`` is off:
  a job asking for a mixture wants it mixed). Per chunk of positions, its label counts are drawn at init
  (multivariate hypergeometric), and its labels made when read (a seeded permutation of that multiset).
* ``"stratified"``: every full block of ``stratum`` positions (a global batch) holds each source floor or ceil of
  ``stratum * w_s`` times, the ceil going to the sources furthest behind their share; the last blocks take what
  is left, so only full blocks before the counts run short are guaranteed within one of the share.

Neighbouring positions read neighbouring positions of each source's order: a batch touches about one or two
shards per source (LMDB locality). Everything depends on (manifest, sources, weights, seed, epoch) only.
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np

from samplecache.reading.ordering.apportion import (
    block_counts,
    hamilton,
    integer_weights,
    largest,
    random_counts,
)
from samplecache.reading.ordering.order import EpochOrder, kept

MIXES = ("random", "stratified")
CHUNK = 1 << 16  # positions whose labels are made together (and cached)
FEW_RANGES = 32  # reads per source counted range by range up to this many ranges, else position by position
CACHED_CHUNKS = 8
_COUNTS, _LABELS = 3, 4  # rng stream tags (partition.py uses none, 1 and 2 after (seed, epoch))


def _rng(seed: int, epoch: int, *extra: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, epoch, *extra])


def _source_seed(seed: int, name: str) -> int:
    """Each source's own seed: its shuffle does not depend on which other sources the manifest holds."""
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, zlib.crc32(name.encode())]).generate_state(1)[0])


def _source_weights(names: list[str], weights: Mapping[str, float], source_of: np.ndarray, rows: np.ndarray,
                    shards: int) -> list[int]:
    """Integer weights per name, after checking the mixture against the manifest's sources."""
    unknown = [n for n in weights if n not in names]
    if unknown:
        raise ValueError(f"mixture weights name source(s) {unknown} this manifest does not hold (its sources: "
                         f"{names})")
    bad = {n: w for n, w in weights.items() if not (math.isfinite(float(w)) and w >= 0)}
    if bad:
        raise ValueError(f"mixture weights must be finite and >= 0, not {bad}")
    if len(source_of) != shards or len(rows) != shards:
        raise ValueError(f"{shards} shard ids, {len(rows)} row counts and {len(source_of)} sources differ")
    if shards and not 0 <= source_of.min() <= source_of.max() < len(names):
        raise ValueError(f"source_of holds indices outside the {len(names)} source names")
    a = integer_weights([weights.get(n, 0.0) for n in names])
    resident = np.bincount(source_of, weights=rows, minlength=len(names))
    empty = [n for n, x, r in zip(names, a, resident.tolist()) if x > 0 and r == 0]
    if empty:
        raise ValueError(f"mixture weights give a share to source(s) {empty} with no resident samples in this "
                         f"manifest")
    return a


class MixedOrder:
    """Global position -> (manifest index, row) for one epoch of a mixture of sources (``EpochOrder``'s
    interface). ``names[source_of[i]]`` is manifest index ``i``'s source; a source missing from ``weights`` has
    weight 0. ``epoch_samples``: the epoch's length (default: the largest with no source repeating a sample)."""


    def __init__(self, ids: np.ndarray, rows: np.ndarray, source_of: np.ndarray, names: Sequence[str],
                 weights: Mapping[str, float], seed: int, epoch: int, shuffle: bool, window: int = 0,
                 mix: str = "random", stratum: int = 0, epoch_samples: int | None = None, *,
                 chunk: int = CHUNK) -> None:
        if mix not in MIXES:
            raise ValueError(f"mix must be one of {MIXES}, not {mix!r}")
        if mix == "stratified" and stratum < 1:
            raise ValueError(f"a stratified mixture needs stratum >= 1 (the global batch size), not {stratum}")
        if epoch_samples is not None and epoch_samples < 0:
            raise ValueError(f"epoch_samples must be >= 0, not {epoch_samples}")
        names = list(names)
        source_of, rows = np.asarray(source_of, np.int64), np.asarray(rows, np.int64)
        a = _source_weights(names, weights, source_of, rows, len(ids))
        self.ids, self.rows, self.source_of, self.names = ids, rows, source_of, names
        self.seed, self.epoch, self.shuffle, self.mix = seed, epoch, shuffle, mix
        self.window = int(window) if shuffle and window > 1 else 0
        self.stratum = int(stratum)
        active = [s for s in range(len(names)) if a[s] > 0]
        self.members = [np.flatnonzero(source_of == s) for s in active]
        self.spread = max(1, len(active))  # neighbouring positions read this many sources' shards in turn
        self.sources = [EpochOrder(ids[m], rows[m], _source_seed(seed, names[s]), epoch, shuffle, window)
                        for s, m in zip(active, self.members)]
        aw = [a[s] for s in active]
        resident = [len(o) for o in self.sources]
        self.total = largest(resident, aw) if epoch_samples is None else int(epoch_samples)
        n = hamilton(self.total, aw)
        self.counts = {names[s]: c for s, c in zip(active, n)}
        self.weights = {names[s]: x / sum(aw) for s, x in zip(active, aw)}
        self._label = np.arange(len(active), dtype=np.uint16 if len(active) < 1 << 16 else np.int32)
        if mix == "random":
            self.chunk = int(chunk)
            self._blocks = None
            per_chunk = random_counts(n, self.chunk, _rng(seed, epoch, _COUNTS))
        else:
            # chunks of whole blocks, so a block's labels are made (and permuted) in one piece
            self.chunk = self.stratum * max(1, int(chunk) // self.stratum)
            self._blocks = block_counts(n, aw, self.stratum)
            starts = np.arange(0, len(self._blocks), self.chunk // self.stratum)
            per_chunk = np.add.reduceat(self._blocks, starts, axis=0) if len(starts) else self._blocks
        # prefix[c, s]: positions before chunk c labelled s (source-local index of the chunk's first s)
        self.prefix = np.zeros((len(per_chunk) + 1, len(active)), np.int64)
        np.cumsum(per_chunk, axis=0, out=self.prefix[1:])
        self._labels: OrderedDict[int, np.ndarray] = OrderedDict()  # chunk -> its positions' labels
        self._locals: OrderedDict[int, np.ndarray] = OrderedDict()  # chunk -> each position's index among its label's

    def __len__(self) -> int:
        return self.total

    def _make_labels(self, c: int) -> np.ndarray:
        """Chunk ``c``'s labels."""
        size = min(self.chunk, self.total - c * self.chunk)
        counts = self.prefix[c + 1] - self.prefix[c]
        rng = _rng(self.seed, self.epoch, _LABELS, c)
        if self._blocks is None:
            return rng.permutation(np.repeat(self._label, counts))
        B, per = self.stratum, self.chunk // self.stratum
        blocks = self._blocks[c * per:(c + 1) * per]
        labels = np.repeat(np.tile(self._label, len(blocks)), blocks.ravel())
        full = size // B
        labels[:full * B] = rng.permuted(labels[:full * B].reshape(full, B), axis=1).ravel()
        labels[full * B:] = rng.permutation(labels[full * B:])
        return labels

    def _make_local(self, c: int) -> np.ndarray:
        """Each position of chunk ``c``: its index among the chunk's positions of its label (what ``positions``
        needs; ``span`` counts the labels before its start instead)."""
        labels = self._labels_of(c)
        counts = self.prefix[c + 1] - self.prefix[c]
        local = np.empty(len(labels), np.int32)
        local[np.argsort(labels, kind="stable")] = np.arange(len(labels)) - np.repeat(np.cumsum(counts) - counts,
                                                                                       counts)
        return local

    def _labels_of(self, c: int) -> np.ndarray:
        return kept(self._labels, c, lambda: self._make_labels(c), CACHED_CHUNKS)

    def _chunk_of(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        return self._labels_of(c), kept(self._locals, c, lambda: self._make_local(c), CACHED_CHUNKS)

    def _labelled(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each position's source (index into the weighted sources) and its index in that source's order."""
        c = g // self.chunk
        if c[0] == c[-1] and (c == c[0]).all():
            labels, local = self._chunk_of(int(c[0]))
            off = g - int(c[0]) * self.chunk
            lab = labels[off]
            return lab, self.prefix[int(c[0])][lab] + local[off]
        lab, j = np.empty(len(g), self._label.dtype), np.empty(len(g), np.int64)
        for k in np.unique(c).tolist():
            sel = np.flatnonzero(c == k)
            labels, local = self._chunk_of(k)
            off = g[sel] - k * self.chunk
            lab[sel] = labels[off]
            j[sel] = self.prefix[k][lab[sel]] + local[off]
        return lab, j

    def source_counts(self, ranges: np.ndarray) -> dict[str, int]:
        """How many positions of the (k, 2) [a, b) ranges of the global order (past the end: wrapped) each
        weighted source holds (what a reader read, per source). A few long ranges (a rank alone) are counted by
        label slices, no position made; many short ones (ranks and workers taking turns) position by position,
        a chunk of labels at a time (a numpy call per range would cost more than the positions)."""
        ranges = np.asarray(ranges, np.int64).reshape(-1, 2)
        ranges = ranges[ranges[:, 1] > ranges[:, 0]]
        got = np.zeros(len(self.counts), np.int64)
        if self.total == 0 or len(ranges) == 0:
            return {}
        if len(ranges) > FEW_RANGES:
            lengths = ranges[:, 1] - ranges[:, 0]
            g = (np.arange(int(lengths.sum()), dtype=np.int64)
                 + np.repeat(ranges[:, 0] - (np.cumsum(lengths) - lengths), lengths)) % self.total
            c = g // self.chunk
            for k in np.unique(c).tolist():
                got += np.bincount(self._labels_of(k)[g[c == k] - k * self.chunk], minlength=len(got))
        else:
            for a, b in ranges.tolist():
                while a < b:
                    p = a % self.total
                    n = min(b - a, self.total - p)
                    for k in range(p // self.chunk, (p + n - 1) // self.chunk + 1):
                        lo, hi = max(p, k * self.chunk), min(p + n, (k + 1) * self.chunk)
                        got += np.bincount(self._labels_of(k)[lo - k * self.chunk:hi - k * self.chunk],
                                           minlength=len(got))
                    a += n
        return {name: int(n) for name, n in zip(self.counts, got.tolist()) if n}

    def warm(self) -> None:
        """Make what the first batch needs now: the first chunk's labels, each source's first row order."""
        if self.total:
            self._labels_of(0)
            for o in self.sources:
                o.warm()

    def positions(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(manifest index, row) arrays of global positions ``g`` (int64; past the end: wrapped)."""
        if self.total == 0 or len(g) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        g = np.asarray(g, dtype=np.int64) % self.total
        lab, j = self._labelled(g)
        idx, rows = np.empty(len(g), np.int64), np.empty(len(g), np.int64)
        for s, (order, members) in enumerate(zip(self.sources, self.members)):
            sel = np.flatnonzero(lab == s)
            if len(sel):
                # the source's order wraps j past its length: an upsampled source's samples come round again.
                # Neighbouring positions take a run of the source's order: read shard by shard (span), not by search
                js = j[sel]
                a, b = int(js[0]), int(js[-1]) + 1
                i, r = order.span(a, b) if b - a == len(js) and (js[1:] > js[:-1]).all() else order.positions(js)
                idx[sel], rows[sel] = members[i], r
        return idx, rows

    def span(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(manifest index, row) of the positions [a, b): per chunk of labels, each source's positions there are a
        run of its order (they are its next ones), read as one ``span`` of it; no per-position arithmetic."""
        n = b - a
        if self.total == 0 or n <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        a %= self.total
        if a + n > self.total:  # wraps past the end (padding): position by position
            return self.positions(np.arange(a, a + n, dtype=np.int64))
        idx, rows = np.empty(n, np.int64), np.empty(n, np.int64)
        pos = a
        while pos < a + n:
            c = pos // self.chunk
            end = min(a + n, (c + 1) * self.chunk)
            labels = self._labels_of(c)
            o0, o1 = pos - c * self.chunk, end - c * self.chunk
            lab = labels[o0:o1]
            before = np.bincount(labels[:o0], minlength=len(self.sources))  # each source's positions before o0
            out_idx, out_rows = idx[pos - a:end - a], rows[pos - a:end - a]
            for s, (order, members) in enumerate(zip(self.sources, self.members)):
                sel = np.flatnonzero(lab == s)
                if len(sel):
                    j = int(self.prefix[c, s] + before[s])
                    i, r = order.span(j, j + len(sel))
                    out_idx[sel], out_rows[sel] = members[i], r
            pos = end
        return idx, rows

    def runs(self, a: int, b: int, out: list[tuple[int, np.ndarray]]) -> None:
        """Append the positions [a, b) to ``out`` as (manifest index, rows) runs of equal manifest index (short
        here: the sources interleave)."""
        if self.total == 0 or b <= a:
            return
        idx, rows = self.span(a, b)
        cuts = np.flatnonzero(idx[1:] != idx[:-1]) + 1
        out.extend(zip(idx[np.r_[0, cuts]].tolist(), np.split(rows, cuts)))


def mixture_counts(rows: np.ndarray, source_of: np.ndarray, names: Sequence[str], weights: Mapping[str, float],
                   epoch_samples: int | None = None) -> dict[str, int]:
    """The per-source counts of an epoch of the mixture (what ``MixedOrder(...).counts`` holds, without making
    its order): a source of weight 0 is left out."""
    names = list(names)
    source_of, rows = np.asarray(source_of, np.int64), np.asarray(rows, np.int64)
    a = _source_weights(names, weights, source_of, rows, len(rows))
    active = [s for s in range(len(names)) if a[s] > 0]
    resident = np.bincount(source_of, weights=rows, minlength=len(names)).astype(np.int64).tolist()
    aw = [a[s] for s in active]
    total = largest([resident[s] for s in active], aw) if epoch_samples is None else int(epoch_samples)
    return {names[s]: c for s, c in zip(active, hamilton(total, aw))}


__all__ = ["MIXES", "CHUNK", "MixedOrder", "mixture_counts"]
