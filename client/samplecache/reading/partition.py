"""Splitting an epoch over ranks and DataLoader workers (pure numpy functions).

The epoch is one global sequence: shards in (shuffled) order, each shard's rows
in (shuffled) order. Rank r takes a contiguous range of that sequence, and each
DataLoader worker a contiguous part of its rank's range, so shards are read
with locality and every sample is delivered exactly once. ``partial`` says what
to do when the total does not divide by the world size:

* ``"pad"``  every rank gets ceil(total / world) samples; the missing ones repeat
  the start of the sequence (at most world - 1 repeats on one host; a job over
  several hosts, each with its own manifest, pads every host up to the largest
  host's count);
* ``"drop"`` every rank gets floor(total / world); the tail (< world samples) is dropped;
* ``"uneven"`` exact split, ranks may differ by one sample (never use with DDP).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PARTIAL = ("pad", "drop", "uneven")


@dataclass(frozen=True)
class Span:
    """Positions [start, stop) of the shard at ``index`` in the manifest, in that shard's row order."""

    index: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def _rng(seed: int, epoch: int, *extra: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, epoch, *extra])


def shard_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    return _rng(seed, epoch).permutation(n_shards) if shuffle else np.arange(n_shards)


def row_order(shard_id: int, rows: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order rows of one shard are read in (depends only on seed, epoch, shard)."""
    return _rng(seed, epoch, 1, shard_id).permutation(rows) if shuffle else np.arange(rows)


def rank_range(total: int, rank: int, world: int, partial: str = "pad") -> tuple[int, int]:
    """This rank's [start, stop) in the global sequence; stop may pass ``total`` (padding)."""
    if partial not in PARTIAL:
        raise ValueError(f"partial must be one of {PARTIAL}, not {partial!r}")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in [0, {world})")
    if partial == "uneven":
        return total * rank // world, total * (rank + 1) // world
    per = -(-total // world) if partial == "pad" else total // world
    if partial == "pad" and total == 0:
        per = 0
    return rank * per, (rank + 1) * per


def part_range(start: int, stop: int, part: int, parts: int) -> tuple[int, int]:
    """Part ``part`` of ``parts`` contiguous, near-equal parts of [start, stop)."""
    n = stop - start
    return start + n * part // parts, start + n * (part + 1) // parts


def spans_for(rows: np.ndarray, order: np.ndarray, start: int, stop: int) -> list[Span]:
    """The spans covering global positions [start, stop) (wrapping past the end: padding)."""
    total = int(rows.sum())
    if total == 0 or stop <= start:
        return []
    ordered = rows[order]
    ends = np.cumsum(ordered)
    out: list[Span] = []
    pos = start
    while pos < stop:
        g = pos % total
        k = int(np.searchsorted(ends, g, side="right"))
        lo = g - int(ends[k] - ordered[k])
        take = min(int(ordered[k]) - lo, stop - pos)
        out.append(Span(int(order[k]), lo, lo + take))
        pos += take
    return out
