"""Property tests of the eviction planner (``samplecache_service.store.eviction.plan_eviction``) for every policy.

Covers the planner's half of DESIGN invariant 2: pinned shards are never named, a plan that says it fits
leaves the cache within budget, nothing is evicted when everything fits, the greedy prefix is minimal, and
``fits`` is False only when even evicting every unpinned shard would not make room. A simulation of a stream
of ingests through the planner (with random pins) keeps the resident bytes within budget + one shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samplecache_service.store.eviction import POLICIES, EvictionPlan, plan_eviction

ALL_POLICIES = sorted(POLICIES)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class FakeShard:
    id: int
    bytes: int
    last_used_epoch: int


@st.composite
def shard_lists(draw: st.DrawFn, max_size: int = 30) -> list[FakeShard]:
    """Shards in id (= age) order: ids strictly increasing, bytes 1..10^6, last_used_epoch -1..20."""
    n = draw(st.integers(0, max_size))
    gaps = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n))
    used = draw(st.lists(st.integers(-1, 20), min_size=n, max_size=n))
    out, sid = [], draw(st.integers(0, 100))
    for gap, size, epoch in zip(gaps, sizes, used):
        sid += gap
        out.append(FakeShard(sid, size, epoch))
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[FakeShard], set[int], int, int, str, int]:
    shards = draw(shard_lists())
    ids = [s.id for s in shards]
    pinned = set(draw(st.lists(st.sampled_from(ids), unique=True))) if ids else set()
    if draw(st.booleans()):  # pins may name shards that are not resident (an epoch's evicted-by-then ids)
        pinned |= set(draw(st.lists(st.integers(10**6, 10**6 + 50), max_size=3)))
    resident = sum(s.bytes for s in shards)
    # budgets around the resident size, so that "fits already", "evict some" and "cannot fit" all occur
    budget = draw(st.one_of(st.integers(0, max(1, resident)), st.integers(0, resident + 2 * 10**6),
                            st.just(resident)))
    incoming = draw(st.integers(0, 10**6))
    policy = draw(st.sampled_from(ALL_POLICIES))
    seed = draw(st.integers(0, 2**32))
    return shards, pinned, budget, incoming, policy, seed


def by_id(shards: list[FakeShard]) -> dict[int, FakeShard]:
    return {s.id: s for s in shards}


# ---------------------------------------------------------------------------------------------- safety
@SETTINGS
@given(scenarios())
def test_plan_is_safe_and_within_budget(sc: tuple[list[FakeShard], set[int], int, int, str, int]) -> None:
    shards, pinned, budget, incoming, policy, seed = sc
    plan = plan_eviction(shards, pinned, budget, incoming, policy, seed)
    assert isinstance(plan, EvictionPlan)
    known = by_id(shards)
    # only resident, unpinned shards, each at most once
    assert len(set(plan.evict)) == len(plan.evict)
    assert all(sid in known for sid in plan.evict), plan.evict
    assert not set(plan.evict) & pinned, f"pinned shards named: {set(plan.evict) & pinned}"
    # freed is what the plan names
    assert plan.freed == sum(known[sid].bytes for sid in plan.evict)
    resident = sum(s.bytes for s in shards)
    if plan.fits:
        assert resident - plan.freed + incoming <= budget
    else:
        # only when even evicting every unpinned shard would not make room; then it evicts all of them
        unpinned = [s for s in shards if s.id not in pinned]
        assert resident - sum(s.bytes for s in unpinned) + incoming > budget
        assert set(plan.evict) == {s.id for s in unpinned}


@SETTINGS
@given(scenarios())
def test_nothing_is_evicted_when_everything_fits(sc: tuple[list[FakeShard], set[int], int, int, str, int]) -> None:
    shards, pinned, _, incoming, policy, seed = sc
    resident = sum(s.bytes for s in shards)
    for budget in (resident + incoming, resident + incoming + 1, 10**12):
        plan = plan_eviction(shards, pinned, budget, incoming, policy, seed)
        assert plan == EvictionPlan((), 0, True)


@SETTINGS
@given(scenarios())
def test_evicts_no_more_than_needed(sc: tuple[list[FakeShard], set[int], int, int, str, int]) -> None:
    """Minimality of the greedy prefix: without its last shard the plan would not fit."""
    shards, pinned, budget, incoming, policy, seed = sc
    plan = plan_eviction(shards, pinned, budget, incoming, policy, seed)
    if not plan.evict:
        return
    known = by_id(shards)
    resident = sum(s.bytes for s in shards)
    freed_before_last = plan.freed - known[plan.evict[-1]].bytes
    assert resident - freed_before_last + incoming > budget, "the last evicted shard was not needed"


@SETTINGS
@given(scenarios(), st.data())
def test_plan_is_a_prefix_of_the_policy_order(sc: tuple[list[FakeShard], set[int], int, int, str, int],
                                              data: st.DataObject) -> None:
    """A larger incoming shard never makes the plan evict a *different* set: plans grow by prefix."""
    shards, pinned, budget, incoming, policy, seed = sc
    small = plan_eviction(shards, pinned, budget, incoming, policy, seed)
    more = data.draw(st.integers(0, 10**6))
    big = plan_eviction(shards, pinned, budget, incoming + more, policy, seed)
    assert big.evict[:len(small.evict)] == small.evict


# ---------------------------------------------------------------------------------------------- policies
@SETTINGS
@given(scenarios())
def test_fifo_evicts_oldest_ids_first(sc: tuple[list[FakeShard], set[int], int, int, str, int]) -> None:
    shards, pinned, budget, incoming, _, seed = sc
    plan = plan_eviction(shards, pinned, budget, incoming, "fifo", seed)
    unpinned = sorted(s.id for s in shards if s.id not in pinned)
    assert list(plan.evict) == unpinned[:len(plan.evict)]


@SETTINGS
@given(scenarios())
def test_lru_evicts_least_recently_used_first(sc: tuple[list[FakeShard], set[int], int, int, str, int]) -> None:
    shards, pinned, budget, incoming, _, seed = sc
    plan = plan_eviction(shards, pinned, budget, incoming, "lru", seed)
    known = by_id(shards)
    used = [known[sid].last_used_epoch for sid in plan.evict]
    assert used == sorted(used), "lru did not evict in last_used_epoch order"
    kept = [s for s in shards if s.id not in pinned and s.id not in plan.evict]
    if used and kept:
        assert max(used) <= min(s.last_used_epoch for s in kept)
    # ties broken by age (id)
    expected = sorted((s for s in shards if s.id not in pinned), key=lambda s: (s.last_used_epoch, s.id))
    assert list(plan.evict) == [s.id for s in expected[:len(plan.evict)]]


@SETTINGS
@given(scenarios())
def test_random_is_deterministic_per_seed(sc: tuple[list[FakeShard], set[int], int, int, str, int]) -> None:
    shards, pinned, budget, incoming, _, seed = sc
    a = plan_eviction(shards, pinned, budget, incoming, "random", seed)
    b = plan_eviction(list(shards), set(pinned), budget, incoming, "random", seed)
    assert a == b


def test_random_order_depends_on_the_seed() -> None:
    shards = [FakeShard(i, 100, -1) for i in range(1, 21)]
    plans = {plan_eviction(shards, (), 1000, 0, "random", seed).evict for seed in range(20)}
    assert len(plans) > 10, "random eviction picks the same shards whatever the seed"
    assert all(len(p) == 10 for p in plans)
    fifo = plan_eviction(shards, (), 1000, 0, "fifo").evict
    assert any(p != fifo for p in plans)


def test_random_keeps_a_uniform_sample() -> None:
    """Over many seeds every shard is evicted about equally often (no age bias)."""
    shards = [FakeShard(i, 10, -1) for i in range(1, 11)]
    counts = {s.id: 0 for s in shards}
    seeds = 2000
    for seed in range(seeds):
        for sid in plan_eviction(shards, (), 50, 0, "random", seed).evict:
            counts[sid] += 1
    for sid, c in counts.items():  # expected seeds/2 = 1000 each; 5 sigma is ~ +-112
        assert 850 < c < 1150, counts


@pytest.mark.parametrize("policy", ["nope", "", "FIFO", "lru "])
def test_unknown_policy_raises_value_error(policy: str) -> None:
    with pytest.raises(ValueError, match="unknown eviction policy"):
        plan_eviction([FakeShard(1, 10, -1)], (), 100, 0, policy)
    with pytest.raises(ValueError):  # even when nothing would need evicting
        plan_eviction([], (), 10**9, 0, policy)


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_examples(policy: str) -> None:
    shards = [FakeShard(1, 10, 3), FakeShard(2, 10, 0), FakeShard(3, 10, -1), FakeShard(4, 10, 2)]
    assert plan_eviction(shards, (), 40, 0, policy) == EvictionPlan((), 0, True)
    one = plan_eviction(shards, (), 40, 5, policy)
    assert len(one.evict) == 1 and one.freed == 10 and one.fits
    everything_pinned = plan_eviction(shards, {1, 2, 3, 4}, 40, 5, policy)
    assert everything_pinned == EvictionPlan((), 0, False)
    too_big = plan_eviction(shards, {1}, 40, 41, policy)
    assert not too_big.fits and set(too_big.evict) == {2, 3, 4}
    assert plan_eviction([], (), 0, 1, policy) == EvictionPlan((), 0, False)
    assert plan_eviction([], (), 1, 1, policy) == EvictionPlan((), 0, True)
    if policy == "fifo":
        assert one.evict == (1,)
    if policy == "lru":
        assert one.evict == (3,)


# ---------------------------------------------------------------------------------------------- simulation
@st.composite
def ingest_runs(draw: st.DrawFn) -> tuple[int, list[tuple[int, list[int]]], str, int]:
    """A budget, then a stream of (incoming shard size, indices into the resident list to pin)."""
    max_shard = draw(st.integers(1, 10**6))
    budget = draw(st.integers(max_shard, 10 * max_shard))
    steps = draw(st.lists(st.tuples(st.integers(1, max_shard), st.lists(st.integers(0, 40), max_size=6)),
                          min_size=1, max_size=60))
    return budget, steps, draw(st.sampled_from(ALL_POLICIES)), draw(st.integers(0, 2**32))


@SETTINGS
@given(ingest_runs())
def test_simulated_ingest_stays_within_budget(run: tuple[int, list[tuple[int, list[int]]], str, int]) -> None:
    """Invariant 2: feeding shards through plan_eviction the way the writer does keeps the resident bytes within
    budget + one shard at every step; a shard that does not fit waits (backpressure); pinned shards stay."""
    budget, steps, policy, seed = run
    resident: list[FakeShard] = []
    next_id, max_size, waited = 1, 0, 0
    for epoch, (size, pick) in enumerate(steps):
        max_size = max(max_size, size)
        pinned = {resident[i].id for i in pick if i < len(resident)}
        plan = plan_eviction(resident, pinned, budget, size, policy, seed)
        if plan.fits:
            gone = set(plan.evict)
            assert not gone & pinned
            resident = [s for s in resident if s.id not in gone]
            resident.append(FakeShard(next_id, size, epoch if epoch % 3 == 0 else -1))
            next_id += 1
        else:
            waited += 1
            assert {s.id for s in resident} >= pinned
        total = sum(s.bytes for s in resident)
        assert total <= budget + max_size, f"step {epoch}: {total} resident > budget {budget} + {max_size}"
        assert total <= budget  # the planner itself never goes over: the slack is for the caller


def test_each_source_evicts_within_its_own_share() -> None:
    from dataclasses import dataclass

    from samplecache_service.store.eviction import plan_by_source

    @dataclass
    class S:
        id: int
        bytes: int
        source: str
        last_used_epoch: int = -1

    shards = [S(1, 40, "web"), S(2, 40, "web"), S(3, 10, "code"), S(4, 30, "gone")]
    # 40 more bytes of web in its 0.8 of 100: its oldest goes, code's and the removed source's stay
    assert plan_by_source(shards, [], 100, {"web": 0.8, "code": 0.2}, 40, "web").evict == (1,)
    # no source named: each over its share, and a removed source (no share) holds nothing
    assert plan_by_source(shards, [], 100, {"web": 0.8, "code": 0.2}, 0, None).evict == (4,)
    got = plan_by_source(shards, [4], 100, {"web": 0.5, "code": 0.5}, 0, None)  # pinned: it waits
    assert got.evict == (1,) and not got.fits
