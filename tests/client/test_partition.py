"""The epoch's split over ranks x DataLoader workers (invariants 4 and 5): one topology-free global order
(client/samplecache/reading/ordering/order.py, partition.py), dealt batch by batch from a position
(reading/ordering/deal.py), resumed at that position on any other topology and batch size (core.stream_for)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samplecache.core import Position, stream_for
from samplecache.reading.options import SplitOptions
from samplecache.reading.ordering import stream as stream_module
from samplecache.reading.ordering.deal import (
    PARTIAL,
    epoch_end,
    position_after,
    rank_batches,
    single_rank_items,
    worker_batches,
)
from samplecache.reading.ordering.order import EpochOrder
from samplecache.reading.ordering.partition import row_order, shard_order

Sample = tuple[int, int]  # (manifest index, row of that shard)


def plan_of(rows: list[int], seed: int, epoch: int) -> Any:
    ids = np.random.default_rng(seed).choice(10**9, size=len(rows), replace=False) + 1
    r = np.array(rows, dtype=np.int64)
    return SimpleNamespace(ids=ids, rows=r, total=int(r.sum()), epoch=epoch, orders={}, source_problems={})


def samples(plan: Any, split: SplitOptions, world: int, rank: int, workers: int, worker: int, start: int = 0,
            unit: int = 1, pack: int = 1) -> list[Sample]:
    stream = stream_for(plan, split, Position(rank, world, rank, world, worker, workers), start, unit, pack)
    got = [(int(i), int(r)) for idx, rows in stream.chunks(chunk=7) for i, r in zip(idx, rows)]
    assert len(got) == stream.total
    return got


def rank_batches_seen(plan: Any, split: SplitOptions, world: int, workers: int, unit: int, pack: int,
                      start: int = 0) -> list[list[list[Sample]]]:
    """Per rank, its batches in the order DataLoader hands them out (items round-robin over the workers)."""
    out = []
    for rank in range(world):
        per_worker = []
        for w in range(workers):
            stream = stream_for(plan, split, Position(rank, world, rank, world, w, workers), start, unit, pack)
            items = []
            for idx, rows, u in stream.batch_groups(0, unit, unit * pack, 5, False):
                pairs = [(int(i), int(r)) for i, r in zip(idx, rows)]
                for a in range(0, len(pairs), u):
                    items.append([pairs[a + b:a + b + unit] for b in range(0, min(u, len(pairs) - a), unit)])
            per_worker.append(items)
        batches, i = [], 0
        while any(per_worker):
            w = i % workers
            if per_worker[w]:
                batches.extend(per_worker[w].pop(0))
            i += 1
        out.append(batches)
    return out


def everything(rows: list[int]) -> Counter:
    return Counter((i, r) for i, n in enumerate(rows) for r in range(n))


def global_order(plan: Any, split: SplitOptions) -> list[Sample]:
    o = EpochOrder(plan.ids, plan.rows, split.seed, plan.epoch, split.shuffle, split.shuffle_buffer)
    idx, rows = o.positions(np.arange(o.total))
    return list(zip(idx.tolist(), rows.tolist()))


shard_rows = st.lists(st.integers(0, 40), min_size=0, max_size=10)
topo = dict(world=st.integers(1, 5), workers=st.integers(1, 3), unit=st.integers(1, 6), pack=st.integers(1, 3))
order_args = dict(seed=st.integers(0, 2**40), epoch=st.integers(0, 1000), shuffle=st.booleans(),
                  window=st.sampled_from([0, 0, 5, 64]))


@settings(max_examples=200, deadline=None)
@given(rows=shard_rows, **order_args)
def test_the_global_order_is_a_permutation_of_the_manifest(rows, seed, epoch, shuffle, window) -> None:
    plan = plan_of(rows, seed, epoch)
    got = global_order(plan, SplitOptions(shuffle, seed, "pad", window))
    assert Counter(got) == everything(rows) and len(got) == sum(rows)


@settings(max_examples=200, deadline=None)
@given(rows=shard_rows, partial=st.sampled_from(PARTIAL), **topo, **order_args)
def test_ranks_and_workers_read_the_global_order_batch_by_batch(rows, partial, world, workers, unit, pack, seed,
                                                               epoch, shuffle, window) -> None:
    plan = plan_of(rows, seed, epoch)
    split = SplitOptions(shuffle, seed, partial, window)
    seq = global_order(plan, split)
    total = len(seq)
    seen = rank_batches_seen(plan, split, world, workers, unit, pack)
    end = epoch_end(total, 0, world, partial)
    # step k, rank r: the next `unit` positions of the order (the last step split over the ranks)
    for rank, batches in enumerate(seen):
        want = rank_batches(0, end, rank, world, unit)
        assert [len(b) for b in batches] == (want[:, 1] - want[:, 0]).tolist()
        for b, (a, z) in zip(batches, want.tolist()):
            assert b == [seq[g % total] for g in range(a, z)]
    got = Counter(s for r in seen for b in r for s in b)
    sizes = [sum(len(b) for b in r) for r in seen]
    if partial == "pad":
        assert sizes == [-(-total // world)] * world and set(got) == set(everything(rows))
        assert sum(sizes) - total < world  # repeats: the start of the order
    elif partial == "drop":
        assert sizes == [total // world] * world and max(got.values(), default=1) == 1
    else:
        assert got == everything(rows)
    if partial != "uneven":
        assert len({len(r) for r in seen}) == 1  # the same number of batches on every rank: DDP never hangs


@settings(max_examples=300, deadline=None)
@given(rows=shard_rows, before=st.fixed_dictionaries(topo), after=st.fixed_dictionaries(topo),
       steps=st.integers(0, 30), partial=st.sampled_from(["drop", "uneven"]), **order_args)
def test_a_position_resumes_exactly_on_any_topology_and_batch_size(rows, before, after, steps, partial, seed,
                                                                    epoch, shuffle, window) -> None:
    plan = plan_of(rows, seed, epoch)
    split = SplitOptions(shuffle, seed, partial, window)
    total = plan.total
    w, u = before["world"], before["unit"]
    seen = rank_batches_seen(plan, split, w, before["workers"], u, before["pack"])
    steps = min(steps, min(len(r) for r in seen))
    read = Counter(s for r in seen for b in r[:steps] for s in b)  # every rank took `steps` batches
    at = position_after(0, epoch_end(total, 0, w, partial), w, u, steps)
    assert sum(read.values()) == at  # the position: samples consumed by every rank together
    rest = rank_batches_seen(plan, split, after["world"], after["workers"], after["unit"], after["pack"], at)
    read.update(s for r in rest for b in r for s in b)
    if partial == "uneven":
        assert read == everything(rows)  # exactly once across the kill and the resume
    else:
        assert max(read.values(), default=1) == 1 and total - len(read) < w + after["world"]


@settings(max_examples=100, deadline=None)
@given(rows=shard_rows, **topo, **order_args)
def test_the_split_depends_on_nothing_else(rows, world, workers, unit, pack, seed, epoch, shuffle, window) -> None:
    split = SplitOptions(shuffle, seed, "pad", window)
    a = rank_batches_seen(plan_of(rows, seed, epoch), split, world, workers, unit, pack)
    b = rank_batches_seen(plan_of(rows, seed, epoch), split, world, workers, unit, pack)
    assert a == b


@settings(max_examples=150, deadline=None)
@given(rows=shard_rows, start=st.integers(0, 100), partial=st.sampled_from(PARTIAL), **topo, **order_args)
def test_a_stream_reads_runs_and_scattered_positions_alike(rows, start, partial, world, workers, unit, pack, seed,
                                                          epoch, shuffle, window) -> None:
    plan = plan_of(rows, seed, epoch)
    split = SplitOptions(shuffle, seed, partial, window)
    for rank, w in ((0, 0), (world - 1, workers - 1)):
        pos = Position(rank, world, rank, world, w, workers)
        runs = [np.concatenate(x) for x in zip(*stream_for(plan, split, pos, start, unit, pack).chunks(chunk=64))]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(stream_module, "FEW_RANGES", 0)  # every chunk through the vectorised path
            one = [np.concatenate(x) for x in zip(*stream_for(plan, split, pos, start, unit, pack).chunks(chunk=64))]
        assert all(np.array_equal(a, b) for a, b in zip(runs, one))


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 50), n=st.integers(0, 200), unit=st.integers(1, 9), workers=st.integers(1, 4),
       pack=st.integers(1, 5))
def test_a_single_ranks_items_are_its_dealt_batches_in_runs(start, n, unit, workers, pack) -> None:
    def expand(ranges: np.ndarray) -> list[int]:
        return [g for a, b in ranges.tolist() for g in range(a, b)]

    batches = rank_batches(start, start + n, 0, 1, unit)
    for w in range(workers):
        assert expand(single_rank_items(start, start + n, unit, w, workers, pack)) == \
            expand(worker_batches(batches, unit, w, workers, pack))


def test_no_shuffle_is_the_manifest_order_dealt_by_batch() -> None:
    plan = plan_of([3, 0, 2], 5, 7)
    split = SplitOptions(False, 5, "uneven")
    assert global_order(plan, split) == [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1)]
    # steps of 2 ranks x 2: rank 0 takes positions 0-1, rank 1 2-3; the last step (1 left) goes to rank 1
    assert samples(plan, split, 2, 0, 1, 0, unit=2) == [(0, 0), (0, 1)]
    assert samples(plan, split, 2, 1, 1, 0, unit=2) == [(0, 2), (2, 0), (2, 1)]


def test_worker_batches_deal_items_round_robin_short_batch_alone() -> None:
    batches = rank_batches(0, 23, 0, 1, 4)  # 5 whole batches of 4, then 3
    assert (batches[:, 1] - batches[:, 0]).tolist() == [4, 4, 4, 4, 4, 3]
    # items of 2 batches: [0,1] [2,3] [4] then the short [5]: workers 0, 1, 0, 1
    assert worker_batches(batches, 4, 0, 2, 2)[:, 0].tolist() == [0, 4, 16]
    assert worker_batches(batches, 4, 1, 2, 2)[:, 0].tolist() == [8, 12, 20]


def test_padding_wraps_to_the_start_of_the_order() -> None:
    plan = plan_of([2, 0, 1], 0, 0)
    split = SplitOptions(False, 0, "pad")
    assert epoch_end(3, 0, 2, "pad") == 4 and epoch_end(3, 1, 2, "pad") == 3 and epoch_end(3, 3, 2, "pad") == 3
    assert samples(plan, split, 2, 1, 1, 0) + samples(plan, split, 2, 0, 1, 0) == [(0, 1), (0, 0), (0, 0), (2, 0)]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(4, 60), seed=st.integers(0, 2**40), start=st.integers(0, 10**6))
def test_epochs_change_the_shard_order(n: int, seed: int, start: int) -> None:
    orders = [tuple(shard_order(n, seed, e, True).tolist()) for e in range(start, start + 10)]
    for o in orders:
        assert sorted(o) == list(range(n))
    assert len(set(orders)) > 1
    if n >= 12:
        assert all(a != b for a, b in zip(orders, orders[1:]))


def test_seed_changes_the_order() -> None:
    a = [shard_order(20, s, 0, True).tolist() for s in range(5)]
    assert len({tuple(x) for x in a}) == 5
    assert sorted(shard_order(20, 2**40 + 3, 0, True).tolist()) == list(range(20))


@settings(max_examples=200, deadline=None)
@given(shard_id=st.integers(0, 2**63 - 1), n=st.integers(0, 500), seed=st.integers(0, 2**40),
       epoch=st.integers(0, 10**6), shuffle=st.booleans())
def test_row_order_is_a_permutation(shard_id, n, seed, epoch, shuffle) -> None:
    o = row_order(shard_id, n, seed, epoch, shuffle)
    assert sorted(o.tolist()) == list(range(n))
    assert np.array_equal(o, row_order(shard_id, n, seed, epoch, shuffle))


def test_row_order_differs_by_shard_and_epoch() -> None:
    base = row_order(1, 50, 0, 0, True)
    assert not np.array_equal(base, row_order(2, 50, 0, 0, True))
    assert not np.array_equal(base, row_order(1, 50, 0, 1, True))
    assert not np.array_equal(base, row_order(1, 50, 1, 0, True))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="partial"):
        epoch_end(10, 0, 2, "wrap")
    with pytest.raises(ValueError, match="rank"):
        rank_batches(0, 10, 2, 2, 1)
    with pytest.raises(ValueError, match="worker"):
        worker_batches(rank_batches(0, 10, 0, 1, 1), 1, 3, 3)


@pytest.mark.parametrize("partial,expect", [("pad", 12), ("drop", 9), ("uneven", 10)])
def test_epoch_end_examples(partial: str, expect: int) -> None:
    assert epoch_end(10, 0, 3, partial) == expect
    assert epoch_end(10, 4, 3, partial) == {"pad": 10, "drop": 10, "uneven": 10}[partial]
    assert epoch_end(0, 0, 3, partial) == 0


def test_an_orders_caches_are_shared_safely_by_threads() -> None:
    """A read-ahead thread and the caller share an order: its caches of row orders and label chunks (``kept``)
    stay consistent under both, each key's value the one made for it, never more than ``most`` kept."""
    import sys
    import threading
    from collections import OrderedDict

    from samplecache.reading.ordering.order import kept
    cache: OrderedDict[int, np.ndarray] = OrderedDict()
    errors: list[BaseException] = []

    def hammer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for key in rng.integers(0, 12, 20_000).tolist():
                assert kept(cache, key, lambda: np.array([key]), most=4)[0] == key
        except BaseException as e:  # noqa: BLE001 -- reported below, on the test's thread
            errors.append(e)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two steps: a race shows at once
    try:
        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert len(cache) <= 4
