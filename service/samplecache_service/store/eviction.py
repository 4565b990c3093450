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


Order = Callable[[Sequence[ShardLike], int], list[int]]


def fifo_order(shards: Sequence[ShardLike], seed: int) -> list[int]:
    """Oldest ingested first (shard ids grow with age)."""
    return sorted(range(len(shards)), key=lambda i: shards[i].id)


def random_order(shards: Sequence[ShardLike], seed: int) -> list[int]:
    """Uniformly random: what stays is a uniform sample of everything ingested so far."""
    return [int(i) for i in np.random.default_rng([seed, len(shards)]).permutation(len(shards))]


def lru_order(shards: Sequence[ShardLike], seed: int) -> list[int]:
    """Least recently used by an epoch first; never-used shards count as used at ingest; ties by age."""
    return sorted(range(len(shards)), key=lambda i: (shards[i].last_used_epoch, shards[i].id))


POLICIES: dict[str, Order] = {"fifo": fifo_order, "random": random_order, "lru": lru_order}
assert sorted(POLICIES) == sorted(EVICTION_POLICIES), "every policy name the settings accept has an order"


def plan_eviction(shards: Sequence[ShardLike], pinned: Iterable[int], budget: int, incoming: int,
                  policy: str = "fifo", seed: int = 0) -> EvictionPlan:
    if policy not in POLICIES:
        raise ValueError(f"unknown eviction policy {policy!r}; choose one of {sorted(POLICIES)}")
    resident = sum(s.bytes for s in shards)
    need = resident + incoming - budget
    if need <= 0:
        return EvictionPlan((), 0, True)
    pins = set(pinned)
    candidates = [s for s in shards if s.id not in pins]
    evict: list[int] = []
    freed = 0
    for i in POLICIES[policy](candidates, seed):
        if freed >= need:
            break
        evict.append(candidates[i].id)
        freed += candidates[i].bytes
    return EvictionPlan(tuple(evict), freed, freed >= need)


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
