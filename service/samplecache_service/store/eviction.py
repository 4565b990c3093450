"""Eviction policies: pure functions that pick which shards to drop to make room.

``plan_eviction(shards, pinned, budget, incoming, policy, seed)`` returns shard
ids to evict so that ``resident - evicted + incoming <= budget``; it never names
a pinned shard and never evicts when everything already fits. When the pinned
shards alone leave no room, it returns the best it can and ``fits`` is False:
the caller must then wait (backpressure), never exceed the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

from samplecache_service.config.settings import EVICTION_POLICIES


class ShardLike(Protocol):
    id: int
    bytes: int
    last_used_epoch: int


class SourcedShard(ShardLike, Protocol):
    source: str


@dataclass(frozen=True)
class EvictionPlan:
    evict: tuple[int, ...]
    freed: int
    fits: bool


class MakeRoom(Protocol):
    """The eviction plan for ``incoming`` more bytes of ``source`` (None: every source over its share)."""

    def __call__(self, incoming: int, source: str | None = None) -> EvictionPlan: ...


def _fifo(ids: np.ndarray, last_used: np.ndarray, seed: int) -> np.ndarray:
    """Oldest ingested first (shard ids grow with age)."""
    return np.argsort(ids, kind="stable")


def _random(ids: np.ndarray, last_used: np.ndarray, seed: int) -> np.ndarray:
    """Uniformly random: what stays is a uniform sample of everything ingested so far."""
    return np.random.default_rng([seed, len(ids)]).permutation(len(ids))


def _lru(ids: np.ndarray, last_used: np.ndarray, seed: int) -> np.ndarray:
    """Least recently used by an epoch first; never-used shards count as used at ingest; ties by age."""
    return np.lexsort((ids, last_used))


Order = Callable[[np.ndarray, np.ndarray, int], np.ndarray]
POLICIES: dict[str, Order] = {"fifo": _fifo, "random": _random, "lru": _lru}
assert sorted(POLICIES) == sorted(EVICTION_POLICIES), "every policy name the settings accept has an order"


def evict_first(ids: np.ndarray, sizes: np.ndarray, last_used: np.ndarray, need: int, policy: str = "fifo",
                seed: int = 0) -> tuple[np.ndarray, int]:
    """The positions (into the columns given) of the shards ``policy`` evicts first until ``need`` bytes are
    freed, in that order, and the bytes they free (less than ``need`` when all of them do not free it)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown eviction policy {policy!r}; choose one of {sorted(POLICIES)}")
    if need <= 0 or not len(ids):
        return np.zeros(0, np.int64), 0
    order = POLICIES[policy](ids, last_used, seed)
    freed = np.cumsum(sizes[order])
    k = min(int(np.searchsorted(freed, need, side="left")) + 1, len(order))
    return order[:k], int(freed[k - 1])


def plan_eviction(shards: Sequence[ShardLike], pinned: Iterable[int], budget: int, incoming: int,
                  policy: str = "fifo", seed: int = 0) -> EvictionPlan:
    if policy not in POLICIES:
        raise ValueError(f"unknown eviction policy {policy!r}; choose one of {sorted(POLICIES)}")
    need = sum(s.bytes for s in shards) + incoming - budget
    if need <= 0:
        return EvictionPlan((), 0, True)
    pins = set(pinned)
    candidates = [s for s in shards if s.id not in pins]
    ids = np.fromiter((s.id for s in candidates), np.int64, len(candidates))
    sizes = np.fromiter((s.bytes for s in candidates), np.int64, len(candidates))
    used = np.fromiter((s.last_used_epoch for s in candidates), np.int64, len(candidates))
    at, freed = evict_first(ids, sizes, used, need, policy, seed)
    return EvictionPlan(tuple(ids[at].tolist()), freed, freed >= need)


def plan_by_source(shards: Sequence[SourcedShard], pinned: Iterable[int], budget: int, shares: Mapping[str, float],
                   incoming: int, source: str | None, policy: str = "fifo", seed: int = 0) -> EvictionPlan:
    """``plan_eviction`` within each source's share of ``budget`` (``shares``: name -> fraction; a source with
    shards and no share, one removed, has none): for ``incoming`` bytes of ``source``, or with ``source`` None
    for every source over its share (nothing incoming)."""
    by_source: dict[str, list[SourcedShard]] = {}
    for s in shards:
        by_source.setdefault(s.source, []).append(s)
    pins = set(pinned)
    names = [source] if source is not None else sorted(set(by_source) | set(shares))
    evict: tuple[int, ...] = ()
    freed, fits = 0, True
    for name in names:
        plan = plan_eviction(by_source.get(name, []), pins, int(budget * shares.get(name, 0.0)),
                             incoming if source is not None else 0, policy, seed)
        evict, freed, fits = evict + plan.evict, freed + plan.freed, fits and plan.fits
    return EvictionPlan(evict, freed, fits)
