"""client/samplecache/reading/partition.py: splitting an epoch over ranks x DataLoader workers (invariants 4 and 5)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samplecache.reading.partition import (
    PARTIAL,
    Span,
    part_range,
    rank_range,
    row_order,
    shard_order,
    spans_for,
)

Sample = tuple[int, int]  # (manifest index, row of that shard)


def epoch_split(rows: np.ndarray, ids: np.ndarray, world: int, workers: int, partial: str, seed: int,
                epoch: int, shuffle: bool) -> dict[tuple[int, int], list[Sample]]:
    """What every (rank, worker) reads, exactly the way dataset.py composes the functions."""
    total = int(rows.sum())
    order = shard_order(len(rows), seed, epoch, shuffle)
    out: dict[tuple[int, int], list[Sample]] = {}
    for rank in range(world):
        r0, r1 = rank_range(total, rank, world, partial)
        for w in range(workers):
            w0, w1 = part_range(r0, r1, w, workers)
            got: list[Sample] = []
            for span in spans_for(rows, order, w0, w1):
                assert isinstance(span, Span)
                assert 0 <= span.start < span.stop <= rows[span.index], span
                assert len(span) == span.stop - span.start
                ro = row_order(int(ids[span.index]), int(rows[span.index]), seed, epoch, shuffle)
                got.extend((span.index, int(r)) for r in ro[span.start:span.stop])
            assert len(got) == w1 - w0
            out[(rank, w)] = got
    return out


def per_rank(split: dict[tuple[int, int], list[Sample]], world: int, workers: int) -> list[list[Sample]]:
    return [[s for w in range(workers) for s in split[(r, w)]] for r in range(world)]


def everything(rows: np.ndarray) -> Counter:
    return Counter((i, r) for i, n in enumerate(rows.tolist()) for r in range(n))


shard_rows = st.lists(st.one_of(st.just(0), st.integers(0, 40)), min_size=0, max_size=12)
common = dict(rows=shard_rows, world=st.integers(1, 8), workers=st.integers(1, 4), seed=st.integers(0, 2**40),
              epoch=st.integers(0, 1000), shuffle=st.booleans())


def _ids(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(10**9, size=n, replace=False) + 1


@settings(max_examples=300, deadline=None)
@given(**common)
def test_uneven_delivers_every_sample_exactly_once(rows, world, workers, seed, epoch, shuffle) -> None:
    rows = np.array(rows, dtype=np.int64)
    split = epoch_split(rows, _ids(len(rows), seed), world, workers, "uneven", seed, epoch, shuffle)
    got = Counter(s for v in split.values() for s in v)
    assert got == everything(rows)
    sizes = [len(r) for r in per_rank(split, world, workers)]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == rows.sum()


@settings(max_examples=300, deadline=None)
@given(**common)
def test_pad_gives_every_rank_ceil_and_repeats_fewer_than_world(rows, world, workers, seed, epoch, shuffle) -> None:
    rows = np.array(rows, dtype=np.int64)
    total = int(rows.sum())
    split = epoch_split(rows, _ids(len(rows), seed), world, workers, "pad", seed, epoch, shuffle)
    ranks = per_rank(split, world, workers)
    per = -(-total // world)
    assert [len(r) for r in ranks] == [per] * world
    got = Counter(s for r in ranks for s in r)
    want = everything(rows)
    assert set(got) == set(want)  # every sample at least once, nothing foreign
    extra = sum(got.values()) - total
    assert extra == per * world - total
    assert 0 <= extra < world
    # the repeats are the start of the epoch's global sequence
    order = shard_order(len(rows), seed, epoch, shuffle)
    ids = _ids(len(rows), seed)
    seq = []
    for span in spans_for(rows, order, 0, total):
        ro = row_order(int(ids[span.index]), int(rows[span.index]), seed, epoch, shuffle)
        seq.extend((span.index, int(r)) for r in ro[span.start:span.stop])
    assert Counter(seq) == want
    if total:
        repeated = [seq[i % total] for i in range(total, total + extra)]
        assert got - want == Counter(repeated)


@settings(max_examples=300, deadline=None)
@given(**common)
def test_drop_gives_every_rank_floor_without_duplicates(rows, world, workers, seed, epoch, shuffle) -> None:
    rows = np.array(rows, dtype=np.int64)
    total = int(rows.sum())
    split = epoch_split(rows, _ids(len(rows), seed), world, workers, "drop", seed, epoch, shuffle)
    ranks = per_rank(split, world, workers)
    assert [len(r) for r in ranks] == [total // world] * world
    got = Counter(s for r in ranks for s in r)
    assert max(got.values(), default=1) == 1  # no duplicates
    assert set(got) <= set(everything(rows))
    assert total - len(got) == total % world  # only the tail (< world samples) is dropped


@settings(max_examples=150, deadline=None)
@given(**common, partial=st.sampled_from(PARTIAL))
def test_split_is_deterministic(rows, world, workers, seed, epoch, shuffle, partial) -> None:
    rows = np.array(rows, dtype=np.int64)
    ids = _ids(len(rows), seed)
    a = epoch_split(rows, ids, world, workers, partial, seed, epoch, shuffle)
    b = epoch_split(rows.copy(), ids.copy(), world, workers, partial, seed, epoch, shuffle)
    assert a == b
    order = shard_order(len(rows), seed, epoch, shuffle)
    total = int(rows.sum())
    for rank in range(world):
        r0, r1 = rank_range(total, rank, world, partial)
        assert spans_for(rows, order, r0, r1) == spans_for(rows, order.copy(), r0, r1)


@settings(max_examples=100, deadline=None)
@given(rows=shard_rows, world=st.integers(1, 8), workers=st.integers(1, 4), partial=st.sampled_from(PARTIAL))
def test_workers_split_their_rank_contiguously(rows, world, workers, partial) -> None:
    rows = np.array(rows, dtype=np.int64)
    total = int(rows.sum())
    for rank in range(world):
        r0, r1 = rank_range(total, rank, world, partial)
        parts = [part_range(r0, r1, w, workers) for w in range(workers)]
        assert parts[0][0] == r0 and parts[-1][1] == r1
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        lens = [b - a for a, b in parts]
        assert max(lens) - min(lens) <= 1


def test_no_shuffle_is_the_manifest_order() -> None:
    rows = np.array([3, 0, 2])
    assert shard_order(3, 5, 7, False).tolist() == [0, 1, 2]
    assert row_order(99, 4, 5, 7, False).tolist() == [0, 1, 2, 3]
    split = epoch_split(rows, np.array([10, 11, 12]), 1, 1, "uneven", 5, 7, False)
    assert split[(0, 0)] == [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1)]


def test_spans_for_wraps_for_padding() -> None:
    rows = np.array([2, 0, 1])
    order = np.array([2, 0, 1])
    assert spans_for(rows, order, 0, 3) == [Span(2, 0, 1), Span(0, 0, 2)]
    assert spans_for(rows, order, 2, 7) == [Span(0, 1, 2), Span(2, 0, 1), Span(0, 0, 2), Span(2, 0, 1)]
    assert spans_for(np.array([0, 0]), np.array([0, 1]), 0, 5) == []
    assert spans_for(rows, order, 4, 4) == []


@settings(max_examples=100, deadline=None)
@given(n=st.integers(4, 60), seed=st.integers(0, 2**40), start=st.integers(0, 10**6))
def test_epochs_change_the_shard_order(n: int, seed: int, start: int) -> None:
    orders = [tuple(shard_order(n, seed, e, True).tolist()) for e in range(start, start + 10)]
    for o in orders:
        assert sorted(o) == list(range(n))
    # Two different epochs may draw the same permutation by chance (1/n!); ten in a row (1/24**9) may not.
    assert len(set(orders)) > 1
    if n >= 12:  # 1/12! per pair: equal neighbours would be a bug, not chance
        assert all(a != b for a, b in zip(orders, orders[1:]))


def test_seed_changes_the_order() -> None:
    a = [shard_order(20, s, 0, True).tolist() for s in range(5)]
    assert len({tuple(x) for x in a}) == 5
    # a seed above 32 bits is folded to 32 bits, so it must not raise
    assert sorted(shard_order(20, 2**40 + 3, 0, True).tolist()) == list(range(20))


@settings(max_examples=200, deadline=None)
@given(shard_id=st.integers(0, 2**63 - 1), n=st.integers(0, 500), seed=st.integers(0, 2**40),
       epoch=st.integers(0, 10**6), shuffle=st.booleans())
def test_row_order_is_a_permutation(shard_id, n, seed, epoch, shuffle) -> None:
    o = row_order(shard_id, n, seed, epoch, shuffle)
    assert sorted(o.tolist()) == list(range(n))
    # it depends only on (shard id, rows, seed, epoch): the manifest position plays no part
    assert np.array_equal(o, row_order(shard_id, n, seed, epoch, shuffle))


def test_row_order_differs_by_shard_and_epoch() -> None:
    base = row_order(1, 50, 0, 0, True)
    assert not np.array_equal(base, row_order(2, 50, 0, 0, True))
    assert not np.array_equal(base, row_order(1, 50, 0, 1, True))
    assert not np.array_equal(base, row_order(1, 50, 1, 0, True))


def test_rank_range_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="partial"):
        rank_range(10, 0, 2, "wrap")
    with pytest.raises(ValueError, match="rank"):
        rank_range(10, 2, 2)
    with pytest.raises(ValueError, match="rank"):
        rank_range(10, -1, 2)


@pytest.mark.parametrize("partial,expect", [
    ("pad", [(0, 4), (4, 8), (8, 12)]),
    ("drop", [(0, 3), (3, 6), (6, 9)]),
    ("uneven", [(0, 3), (3, 6), (6, 10)]),
])
def test_rank_range_examples(partial: str, expect: list[tuple[int, int]]) -> None:
    assert [rank_range(10, r, 3, partial) for r in range(3)] == expect
    assert [rank_range(0, r, 3, partial) for r in range(3)] == [(0, 0)] * 3
