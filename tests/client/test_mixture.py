"""A mixture of sources as one global order (client/samplecache/reading/ordering/mixture.py): exact per-source counts,
upsampling, stratified batches, determinism, and the same interface as EpochOrder."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from math import ceil, floor
from types import SimpleNamespace

import numpy as np
import pytest

from samplecache.reading import source_reads
from samplecache.reading.ordering import apportion as apportion_module
from samplecache.reading.ordering.apportion import apportion, largest_epoch
from samplecache.reading.ordering.deal import rank_batches
from samplecache.reading.ordering.mixture import MIXES, MixedOrder
from samplecache.reading.ordering.order import EpochOrder, joined
from samplecache.reading.ordering.stream import Stream
from samplecache.reading.source_reads import SourceReads

NAMES = ["web", "code", "math"]
WEIGHTS = {"web": 0.7, "code": 0.2, "math": 0.1}


def manifest(shards: tuple[int, ...] = (40, 7, 13), seed: int = 0, least: int = 1, most: int = 30
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, rows, source_of): sources' shards interleaved in the table, unique ids, varied row counts."""
    rng = np.random.default_rng(seed)
    n = sum(shards)
    ids = rng.choice(10**9, size=n, replace=False).astype(np.int64) + 1
    rows = rng.integers(least, most, n).astype(np.int64)
    source_of = rng.permutation(np.repeat(np.arange(len(shards)), shards))
    return ids, rows, source_of


def mixed(mix: str = "random", weights: dict[str, float] = WEIGHTS, seed: int = 7, epoch: int = 3,
          shuffle: bool = True, window: int = 0, stratum: int = 32, epoch_samples: int | None = None,
          chunk: int = 64, table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> MixedOrder:
    ids, rows, source_of = table if table is not None else manifest()
    return MixedOrder(ids, rows, source_of, NAMES, weights, seed, epoch, shuffle, window, mix,
                      stratum if mix == "stratified" else 0, epoch_samples, chunk=chunk)


def resident(o: MixedOrder) -> list[int]:
    return [int(o.rows[o.source_of == s].sum()) for s in range(len(o.names))]


def per_source(o: MixedOrder, idx: np.ndarray) -> dict[str, int]:
    got = np.bincount(o.source_of[idx], minlength=len(o.names))
    return {n: int(got[s]) for s, n in enumerate(o.names) if got[s]}


def fits(n: int, res: list[int], w: list[float]) -> bool:
    return all(c <= r for c, r in zip(apportion(n, w), res))


# -- apportion and largest_epoch ----------------------------------------------------------------------------------
@pytest.mark.parametrize("total, weights, want", [
    (10, [0.7, 0.2, 0.1], [7, 2, 1]),
    (7, [1, 1, 1], [3, 2, 2]),
    (8, [1, 1, 1], [3, 3, 2]),
    (3, [0.5, 0.5], [2, 1]),
    (5, [0, 1, 0], [0, 5, 0]),
    (4, [0, 1, 3], [0, 1, 3]),
    (100, [0.7, 0.2, 0.1], [70, 20, 10]),
    (0, [1, 2], [0, 0]),
    (6, [1 / 3, 1 / 3, 1 / 3], [2, 2, 2]),
])
def test_apportion_known_cases(total, weights, want) -> None:
    assert apportion(total, weights) == want


def test_apportion_sums_exactly_within_one_of_each_share() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        w = (rng.random(rng.integers(1, 6)) * (rng.random() < 0.8 or 0)).tolist()
        w[rng.integers(len(w))] = float(rng.random()) + 0.01
        total = int(rng.integers(0, 10**6))
        got = apportion(total, w)
        assert sum(got) == total
        for c, x in zip(got, w):
            assert abs(c - total * x / sum(w)) < 1 + 1e-9
            assert x > 0 or c == 0


@pytest.mark.parametrize("weights", [[0, 0], [], [1, -0.5], [float("nan"), 1], [float("inf")]])
def test_apportion_rejects_weights_without_a_positive_share(weights) -> None:
    with pytest.raises(ValueError, match="weights"):
        apportion(10, weights)


def test_largest_epoch_fits_and_nothing_larger_does() -> None:
    rng = np.random.default_rng(1)
    for _ in range(150):
        k = int(rng.integers(1, 5))
        res = rng.integers(1, 60, k).tolist()
        w = np.round(rng.random(k), 2).tolist()
        w[int(rng.integers(k))] += 0.05
        n = largest_epoch(res, w)
        assert fits(n, res, w) and not fits(n + 1, res, w)
        # Hamilton is not monotone (the Alabama paradox): check every N up to where a floor must pass resident
        bound = min(ceil((r + 1) * sum(w) / x) for r, x in zip(res, w) if x > 0) + 2
        assert not any(fits(m, res, w) for m in range(n + 1, bound))


def test_largest_epoch_can_exceed_the_plain_bound() -> None:
    # floor(1 / 0.3) = 3, but apportion(4, [0.3, 0.7]) = [1, 3] still fits
    assert largest_epoch([1, 100], [0.3, 0.7]) == 4


def test_largest_epoch_ignores_unweighted_sources_and_is_zero_for_an_empty_weighted_one() -> None:
    assert largest_epoch([100, 0, 50], [1, 0, 1]) == 101  # [51, 0, 50]
    assert largest_epoch([100, 7, 50], [1, 0, 1]) == 101
    assert largest_epoch([100, 0, 50], [1, 0.5, 1]) == 0
    with pytest.raises(ValueError):
        largest_epoch([1, 2], [1])


# -- the order ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("shuffle, window", [(True, 0), (True, 16), (False, 0)])
def test_an_epoch_holds_exact_counts_and_no_repeats(mix, shuffle, window) -> None:
    o = mixed(mix, shuffle=shuffle, window=window)
    assert o.total == largest_epoch(resident(o), [WEIGHTS[n] for n in NAMES]) > 0
    assert len(o) == o.total == sum(o.counts.values())
    assert list(o.counts) == NAMES and list(o.counts.values()) == apportion(o.total, [0.7, 0.2, 0.1])
    idx, rows = o.span(0, o.total)
    assert per_source(o, idx) == o.counts
    assert (rows >= 0).all() and (rows < o.rows[idx]).all()
    seen = Counter(zip(o.ids[idx].tolist(), rows.tolist()))
    assert max(seen.values()) == 1
    # some source is used up: that is why the epoch is no longer
    assert any(c == r for c, r in zip(o.counts.values(), resident(o)))


@pytest.mark.parametrize("mix", MIXES)
def test_upsampling_reads_each_sample_floor_or_ceil_times(mix) -> None:
    o = mixed(mix, epoch_samples=3000)
    res = dict(zip(NAMES, resident(o)))
    assert o.counts == dict(zip(NAMES, apportion(3000, [0.7, 0.2, 0.1])))
    assert o.counts["code"] > res["code"] and o.counts["math"] > res["math"]  # both upsampled
    idx, rows = o.span(0, o.total)
    assert per_source(o, idx) == o.counts
    for s, name in enumerate(NAMES):
        mine = o.source_of[idx] == s
        times = Counter(zip(idx[mine].tolist(), rows[mine].tolist()))
        everyone = {(i, r) for i in np.flatnonzero(o.source_of == s).tolist() for r in range(o.rows[i])}
        n, t = o.counts[name], res[name]
        if n >= t:
            assert set(times) == everyone
            assert set(times.values()) <= {n // t, -(-n // t)} and sum(times.values()) == n
        else:
            assert set(times) <= everyone and max(times.values()) == 1


@pytest.mark.parametrize("stratum", [10, 32, 37, 100, 250])
def test_every_full_stratified_block_holds_each_source_within_one_of_its_share(stratum) -> None:
    o = mixed("stratified", stratum=stratum, epoch_samples=2400, shuffle=True)
    idx, _ = o.span(0, o.total)
    src = o.source_of[idx]
    for b in range(o.total // stratum):
        got = np.bincount(src[b * stratum:(b + 1) * stratum], minlength=3)
        for s, name in enumerate(NAMES):
            share = stratum * Fraction(str(WEIGHTS[name]))
            assert got[s] in (floor(share), ceil(share)), (b, name, got)
    assert per_source(o, idx) == o.counts


def test_stratified_blocks_of_ten_are_exactly_seven_two_one() -> None:
    o = mixed("stratified", stratum=10, epoch_samples=500)
    src = o.source_of[o.span(0, 500)[0]].reshape(50, 10)
    assert all((src == s).sum(axis=1).tolist() == [k] * 50 for s, k in enumerate([7, 2, 1]))
    assert len({tuple(r) for r in src.tolist()}) > 1  # arranged differently in each block


def reference_blocks(n: list[int], a: list[int], B: int) -> np.ndarray:
    """The deficit rule block by block, without the shortcut that repeats whole periods."""
    A, S = sum(a), len(a)
    deficit, left, out = [Fraction(0)] * S, list(n), []
    for _ in range(sum(n) // B):
        behind = [d + Fraction(B * x, A) - B * x // A for d, x in zip(deficit, a)]
        rank = sorted(range(S), key=lambda s: -behind[s])
        give = [B * x // A for x in a]
        for s in rank[:B - sum(give)]:
            give[s] += 1
        if any(g > x for g, x in zip(give, left)):
            give = [min(g, x) for g, x in zip(give, left)]
            for s in rank:
                more = min(B - sum(give), left[s] - give[s])
                give[s] += more
        out.append(give)
        deficit = [d + Fraction(B * x, A) - g for d, x, g in zip(deficit, a, give)]
        left = [x - g for x, g in zip(left, give)]
    if sum(n) % B:
        out.append(left)
    return np.array(out, np.int64).reshape(len(out), S)


@pytest.mark.parametrize("a, B, total", [([7, 2, 1], 32, 5000), ([1, 1, 1], 10, 997), ([5, 3], 4, 101),
                                         ([13, 29, 58], 64, 20000), ([1, 9], 1, 57)])
def test_block_counts_repeat_whole_periods_as_the_rule_would(a, B, total) -> None:
    n = apportion(total, a)
    got = apportion_module.block_counts(n, a, B)
    assert np.array_equal(got, reference_blocks(n, a, B))
    assert got.sum(axis=0).tolist() == n


def test_random_counts_past_the_hypergeometric_limit_still_sum_exactly(monkeypatch) -> None:
    monkeypatch.setattr(apportion_module, "HYPERGEOMETRIC_LIMIT", 1000)
    n = [3000, 1200, 7]
    got = apportion_module.random_counts(n, 64, np.random.default_rng(0))
    sizes = got.sum(axis=1)
    assert got.sum(axis=0).tolist() == n and (sizes[:-1] == 64).all() and sizes[-1] == sum(n) - 64 * (len(got) - 1)


@pytest.mark.parametrize("mix", MIXES)
def test_the_same_seed_and_epoch_give_the_same_order_and_others_do_not(mix) -> None:
    a = mixed(mix).span(0, 300)
    b = mixed(mix).span(0, 300)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    for other in (mixed(mix, epoch=4), mixed(mix, seed=8)):
        c = other.span(0, 300)
        assert not (np.array_equal(a[0], c[0]) and np.array_equal(a[1], c[1]))


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("shuffle, window, epoch_samples", [(True, 0, None), (True, 16, None), (False, 0, None),
                                                           (True, 0, 2500), (True, 16, 2500)])
def test_span_runs_and_positions_agree_across_chunks_and_past_the_end(mix, shuffle, window, epoch_samples) -> None:
    o = mixed(mix, shuffle=shuffle, window=window, chunk=50, epoch_samples=epoch_samples)
    rng = np.random.default_rng(2)
    whole = o.span(0, o.total)
    for _ in range(60):
        a = int(rng.integers(0, 2 * o.total))
        b = a + int(rng.integers(0, 300))
        want = tuple(x[np.arange(a, b) % o.total] for x in whole)
        got: list[tuple[int, np.ndarray]] = []
        o.runs(a, b, got)
        assert all(len(r) and (i != j for (i, _), (j, _) in zip(got, got[1:])) for i, r in got)
        for pair in (o.span(a, b), o.positions(np.arange(a, b)), joined(got)):
            assert all(np.array_equal(x, y) for x, y in zip(pair, want))
    g = rng.integers(0, 3 * o.total, 500)  # scattered over every chunk
    assert all(np.array_equal(x, y[g % o.total]) for x, y in zip(o.positions(g), whole))


def test_a_stream_reads_a_mixed_order_like_an_epoch_order() -> None:
    o = mixed("random")
    batches = rank_batches(0, o.total + 5, 1, 3, 16)
    stream = Stream(o, batches)  # type: ignore[arg-type]
    idx = np.concatenate([i for i, _ in stream.chunks(chunk=23)])
    rows = np.concatenate([r for _, r in stream.chunks(chunk=23)])
    g = np.concatenate([np.arange(x, y) for x, y in batches.tolist()])
    want = o.positions(g)
    assert np.array_equal(idx, want[0]) and np.array_equal(rows, want[1])


@pytest.mark.parametrize("mix", MIXES)
def test_a_single_ranks_stream_reads_its_range_as_spans(mix) -> None:
    """One range (a rank alone, no workers): read a chunk at a time through ``span``, the same positions and the
    same per-source counts as position by position."""
    o = mixed(mix, epoch_samples=3000, chunk=64)
    stream = Stream(o, np.array([[5, o.total + 40]]))  # type: ignore[arg-type]
    idx = np.concatenate([i for i, _ in stream.chunks(chunk=97)])
    rows = np.concatenate([r for _, r in stream.chunks(chunk=97)])
    want = o.positions(np.arange(5, o.total + 40))
    assert np.array_equal(idx, want[0]) and np.array_equal(rows, want[1])
    counts = Counter(o.names[s] for s in o.source_of[idx].tolist())
    assert o.source_counts(stream.global_ranges(0, len(stream))) == dict(counts)  # past the end: wrapped
    assert o.source_counts(np.array([[0, o.total]])) == o.counts
    some = np.arange(70, 1900)  # a run across chunks: counted by slices, as position by position
    assert o.source_counts(np.array([[70, 1900]])) == dict(Counter(o.names[s] for s in
                                                                   o.source_of[o.positions(some)[0]].tolist()))


@pytest.mark.parametrize("mix", MIXES)
def test_a_workers_stream_counts_its_scattered_ranges(mix) -> None:
    """A stream of ranges dealt apart (a worker's batches): the global ranges of any stretch of it are its
    positions, and the per-source counts over them what position by position finds."""
    o = mixed(mix, epoch_samples=3000, chunk=64)
    batches = np.array([[a, a + 16] for a in range(0, o.total + 64, 48)])  # every third batch, the last past the end
    stream = Stream(o, batches)  # type: ignore[arg-type]
    g = np.concatenate([np.arange(x, y) for x, y in batches.tolist()])
    for start, stop in [(0, len(stream)), (3, 200), (17, 18), (40, 33), (len(stream) - 5, len(stream) + 9)]:
        ranges = stream.global_ranges(start, stop)
        got = np.concatenate([np.arange(a, b) for a, b in ranges.tolist()]) if len(ranges) else np.zeros(0, int)
        assert np.array_equal(got, g[max(0, start):stop])
        want = Counter(o.names[s] for s in o.source_of[o.positions(got)[0]].tolist()) if len(got) else Counter()
        assert o.source_counts(ranges) == dict(want)


def test_reads_per_source_are_counted_seldom_while_read_and_exactly_at_the_end() -> None:
    """``SourceReads``: a count waits for ``COUNT_EVERY`` samples and ``COUNT_EVERY_S`` seconds since the last one;
    the last count, at the epoch's end, is exact whenever it comes."""
    o = mixed("random", epoch_samples=3000, chunk=64)
    batches = np.array([[a, a + 16] for a in range(0, o.total, 48)])
    stream = Stream(o, batches)  # type: ignore[arg-type]
    keeper = SimpleNamespace(read_sources=None)
    reads = SourceReads(o, stream, keeper)  # type: ignore[arg-type]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(source_reads, "COUNT_EVERY_S", 3600.0)
        reads.read(len(stream))  # enough samples, too soon: not counted
        assert keeper.read_sources is None
        m.setattr(source_reads, "COUNT_EVERY_S", 0.0)
        m.setattr(source_reads, "COUNT_EVERY", 100)
        reads.read(99)
        assert keeper.read_sources is None  # too few samples
        reads.read(150)
        assert sum(keeper.read_sources.values()) == 150
        m.setattr(source_reads, "COUNT_EVERY_S", 3600.0)
        reads.read(len(stream) - 1)
        assert sum(keeper.read_sources.values()) == 150  # too soon after the last count
    reads.count(len(stream))
    g = np.concatenate([np.arange(x, y) for x, y in batches.tolist()])
    assert keeper.read_sources == dict(Counter(o.names[s] for s in o.source_of[o.positions(g)[0]].tolist()))


def test_a_single_source_reads_what_its_epoch_order_reads() -> None:
    ids, rows, _ = manifest()
    o = MixedOrder(ids, rows, np.zeros(len(ids), np.int64), ["web"], {"web": 1}, 5, 2, True, chunk=64)
    ref = EpochOrder(ids, rows, 5, 2, True)
    assert o.total == ref.total == int(rows.sum()) and o.counts == {"web": ref.total}
    got, want = o.span(0, o.total), ref.span(0, ref.total)
    assert Counter(zip(*(x.tolist() for x in got))) == Counter(zip(*(x.tolist() for x in want)))


def test_unweighted_sources_are_not_read() -> None:
    o = mixed(weights={"web": 1.0, "code": 0.0})
    idx, _ = o.span(0, o.total)
    assert o.counts == {"web": resident(o)[0]} and per_source(o, idx) == o.counts


def test_a_source_reads_its_own_order_whatever_the_other_weights() -> None:
    table = manifest()
    first = []
    for w in ({"web": 0.7, "code": 0.3}, {"web": 0.5, "code": 0.2, "math": 0.3}):
        o = mixed(weights=w, table=table)
        idx, rows = o.span(0, o.total)
        web = o.source_of[idx] == 0
        first.append(list(zip(idx[web].tolist(), rows[web].tolist()))[:100])
    assert first[0] == first[1]


def test_random_labels_mix_uniformly_also_without_shuffle() -> None:
    got = Counter()
    for seed in range(400):
        o = mixed(seed=seed, shuffle=False, epoch_samples=1000)
        idx, _ = o.span(0, 50)
        assert len(set(o.source_of[idx].tolist())) >= 2  # interleaved, not one source after the other
        got.update(o.source_of[idx[[0, 25, 49]]].tolist())
    for s, name in enumerate(NAMES):
        assert abs(got[s] / 1200 - WEIGHTS[name]) < 0.05


@pytest.mark.parametrize("mix", MIXES)
def test_a_batch_of_neighbouring_positions_reads_one_or_two_shards_per_source(mix) -> None:
    table = manifest((30, 10, 10), least=1100, most=2000)  # a batch holds < 1000 of a source
    o = mixed(mix, stratum=256, chunk=1000, table=table)
    for a in range(0, o.total - 1024, 1024 * 7):
        idx, _ = o.span(a, a + 1024)
        for s in range(3):
            assert len(set(idx[o.source_of[idx] == s].tolist())) <= 2


def test_warm_and_an_empty_epoch() -> None:
    o = mixed(epoch_samples=0)
    o.warm()
    assert len(o) == 0 and all(len(x) == 0 for x in o.positions(np.arange(5)))
    got: list[tuple[int, np.ndarray]] = []
    o.runs(0, 10, got)
    assert got == []
    mixed("stratified").warm()


@pytest.mark.parametrize("kwargs, message", [
    (dict(weights={"web": 1, "video": 1}), "video"),
    (dict(weights={"web": 1, "code": -0.5}), ">= 0"),
    (dict(weights={"web": 0, "code": 0}), "> 0"),
    (dict(weights={}), "> 0"),
    (dict(mix="stratified", stratum=0), "stratum"),
    (dict(mix="sorted"), "mix"),
    (dict(epoch_samples=-1), "epoch_samples"),
])
def test_bad_mixtures_are_refused_naming_the_problem(kwargs, message) -> None:
    ids, rows, source_of = manifest()
    args = dict(weights=WEIGHTS, mix="random", stratum=0, epoch_samples=None) | kwargs
    with pytest.raises(ValueError, match=message):
        MixedOrder(ids, rows, source_of, NAMES, seed=0, epoch=0, shuffle=True, **args)


def test_a_share_for_a_source_without_samples_is_refused_naming_it() -> None:
    ids, rows, source_of = manifest()
    rows[source_of == 2] = 0
    with pytest.raises(ValueError, match="math"):
        MixedOrder(ids, rows, source_of, NAMES, WEIGHTS, 0, 0, True)
    o = MixedOrder(ids, rows, source_of, NAMES, {"web": 1, "code": 1}, 0, 0, True)  # no share: fine
    assert set(o.counts) == {"web", "code"}
