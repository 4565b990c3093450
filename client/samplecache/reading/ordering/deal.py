"""Dealing the rest of an epoch's one global order to ranks x workers, batch by batch (pure numpy functions).

The order (``order.py``) is topology-free; where the job stands in it is one number, the position ``P``: the
samples of the order consumed by every rank together. From ``P`` on, the order is cut into global steps of
``world x unit`` positions (``unit``: the samples of one rank's batch); in each step rank ``r`` takes the ``r``-th
``unit`` positions, so after ``k`` steps the job consumed exactly ``[P, P + k x world x unit)``, whatever the
topology. The last step, shorter, is split in near-equal parts over the ranks. A rank's batches are dealt to its
DataLoader workers by item (``pack`` batches, or a short batch alone), round-robin from worker 0, which is the
order DataLoader hands items out in. ``partial`` sizes the rest ``[P, end)`` when it does not divide by the ranks:

* ``"pad"``  every rank gets ceil(left / world) samples; the missing ones repeat the start of the order
  (positions past its end wrap); a job over several hosts pads every host up to the largest host's count;
* ``"drop"`` every rank gets floor(left / world); the tail (< world samples) is dropped;
* ``"uneven"`` exactly the rest; ranks may differ by one batch (never use with DDP).
"""

from __future__ import annotations

import numpy as np

PARTIAL = ("pad", "drop", "uneven")


def epoch_end(total: int, start: int, world: int, partial: str = "pad", agreed: int | None = None) -> int:
    """The end of what ``world`` ranks read from position ``start`` (may pass ``total``: padding). ``agreed``:
    the samples per rank agreed across hosts (each host with its own manifest)."""
    if partial not in PARTIAL:
        raise ValueError(f"partial must be one of {PARTIAL}, not {partial!r}")
    left = max(0, total - start)
    if partial == "uneven":
        return start + left
    per = int(agreed) if agreed is not None else (-(-left // world) if partial == "pad" else left // world)
    return start + per * world


def rank_batches(start: int, end: int, rank: int, world: int, unit: int) -> np.ndarray:
    """Rank ``rank``'s batches of ``[start, end)`` in order: an (n, 2) array of [a, b) ranges of the order."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in [0, {world})")
    step = world * unit
    full, rest = divmod(max(0, end - start), step)
    a = start + np.arange(full, dtype=np.int64) * step + rank * unit
    out = np.stack([a, a + unit], axis=1) if full else np.zeros((0, 2), np.int64)
    lo, hi = start + full * step + rest * rank // world, start + full * step + rest * (rank + 1) // world
    return np.concatenate([out, np.array([[lo, hi]], np.int64)]) if hi > lo else out


def worker_batches(batches: np.ndarray, unit: int, worker: int, workers: int, pack: int = 1) -> np.ndarray:
    """The batches of a rank that DataLoader worker ``worker`` of ``workers`` makes: items of ``pack`` whole
    batches (the last one may hold fewer), then a short batch as an item of its own, dealt round-robin."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} is not in [0, {workers})")
    sizes = batches[:, 1] - batches[:, 0]
    whole = int(np.count_nonzero(sizes == unit))
    k = np.arange(len(batches))
    item = np.where(k < whole, k // pack, -(-whole // pack))
    mine: np.ndarray = batches[item % workers == worker]
    return mine


def single_rank_items(start: int, end: int, unit: int, worker: int, workers: int, pack: int = 1) -> np.ndarray:
    """``worker_batches(rank_batches(start, end, 0, 1, unit), unit, worker, workers, pack)`` with one range per
    item: a single rank's batches follow each other, so an item is one run (arrays per item, not per batch)."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} is not in [0, {workers})")
    n = max(0, end - start)
    whole = n // unit
    items = -(-whole // pack)
    a = start + np.arange(worker, items, workers, dtype=np.int64) * pack * unit
    out = np.stack([a, np.minimum(a + pack * unit, start + whole * unit)], axis=1)
    if n > whole * unit and items % workers == worker:  # the short batch: an item of its own, next in turn
        out = np.concatenate([out, np.array([[start + whole * unit, end]], np.int64)])
    return out


def position_after(start: int, end: int, world: int, unit: int, batches: int) -> int:
    """The position once every rank took ``batches`` batches from ``start`` (ranks step in lockstep)."""
    return min(end, start + int(batches) * world * unit)


__all__ = ["PARTIAL", "epoch_end", "rank_batches", "worker_batches", "single_rank_items", "position_after"]
