"""service/samplecache_service/remote/planner.py: remote units sampled without replacement, a persisted cursor,
node partitions (invariant 6)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samplecache_service.remote.planner import (
    Pick,
    Planner,
    Unit,
    build_units,
    digest,
    node_of,
    segment_order,
    unit_current,
)
from samplecache_service.store.fileinfo import FileInfo


def make_files(n_files: int = 5, groups: int = 4, seq0: int = 0, prefix: str = "part") -> dict[str, FileInfo]:
    return {f"s3://b/{prefix}-{i:03d}.parquet": FileInfo(row_groups=tuple(10 + i + g for g in range(groups)),
                                                         seq=seq0 + i)
            for i in range(n_files)}


def make_units(n_files: int = 5, groups: int = 4, seq0: int = 0, prefix: str = "part") -> list[Unit]:
    return build_units(make_files(n_files, groups, seq0, prefix))


def drain(p: Planner) -> list[Pick]:
    """Hand out until next() says None (without completing anything)."""
    out = []
    while (pick := p.next()) is not None:
        out.append(pick)
        assert len(out) <= 10 * max(1, len(p)), "next() never stops"
    return out


def finish(p: Planner, picks: list[Pick]) -> None:
    for x in picks:
        p.done(x.cycle, x.position)


# --- units ----------------------------------------------------------------------------------


def test_build_units_order_and_quarantine() -> None:
    files = {"b": FileInfo(row_groups=(5, 6), seq=1), "a": FileInfo(row_groups=(1,), seq=2),
             "c": FileInfo(row_groups=(7,), seq=1), "q": FileInfo(row_groups=(9,), quarantined=True, seq=0),
             "e": FileInfo()}
    units = build_units(files)
    # discovery sequence first, then path; quarantined files keep their units (indices stay stable)
    assert units == [Unit("q", 0, 9), Unit("b", 0, 5), Unit("b", 1, 6), Unit("c", 0, 7), Unit("a", 0, 1)]
    assert build_units(dict(reversed(list(files.items())))) == units


def test_planned_units_are_built_as_planned_and_a_replanned_file_s_old_units_are_not_current() -> None:
    info = FileInfo(row_groups=(4, 4, 4), units=((0, 2, 8), (2, 1, 4)), seq=1)
    units = build_units({"f": info})
    assert units == [Unit("f", 0, 8, 2), Unit("f", 2, 4, 1)]
    assert all(unit_current(u, info) for u in units)
    # the file changed and was planned again: units of the old plan are stale, those of the new one current
    again = FileInfo(row_groups=(4, 4, 4), units=((0, 1, 4), (1, 2, 8)), seq=1)
    assert not any(unit_current(u, again) for u in units)
    assert all(unit_current(u, again) for u in build_units({"f": again}))
    # a record without a plan (older than units): one unit per row group, each current
    assert all(unit_current(u, FileInfo(row_groups=(4, 4))) for u in build_units({"f": FileInfo(row_groups=(4, 4))}))


def test_digest() -> None:
    units = make_units()
    assert digest(units) == digest(list(units))
    assert digest(units) != digest(units[:-1])
    assert digest(units) != digest(units[:-1] + [Unit(units[-1].path, units[-1].row_group, units[-1].rows + 1)])
    assert digest(units) != digest(list(reversed(units)))


def test_segment_order_is_a_permutation_per_segment() -> None:
    o = segment_order([5, 3, 4], seed=1, node_rank=0, cycle=0)
    assert sorted(o[:5].tolist()) == list(range(5))
    assert sorted(o[5:8].tolist()) == [5, 6, 7]
    assert sorted(o[8:].tolist()) == [8, 9, 10, 11]
    # adding a segment does not reorder the earlier ones
    assert segment_order([5, 3], 1, 0, 0).tolist() == o[:8].tolist()
    assert segment_order([], 1, 0, 0).tolist() == []


# --- one cycle --------------------------------------------------------------------------------


def test_full_cycle_hands_out_every_unit_exactly_once() -> None:
    units = make_units()
    p = Planner(units, seed=7)
    picks = drain(p)
    assert Counter(x.unit for x in picks) == Counter(units)
    assert sorted(x.position for x in picks) == list(range(len(units)))
    assert {x.cycle for x in picks} == {0}
    assert [x.unit for x in picks] != units  # a seeded permutation, not the table order
    assert [x.unit for x in picks] == [x.unit for x in drain(Planner(units, seed=7))]
    assert [x.unit for x in picks] != [x.unit for x in drain(Planner(units, seed=8))]


def test_next_is_none_while_the_cycle_waits_for_its_last_units() -> None:
    p = Planner(make_units(2, 2))
    picks = drain(p)
    assert p.next() is None
    for x in picks[:-1]:
        p.done(x.cycle, x.position)
        assert p.next() is None  # one unit still in flight: no new cycle yet
    p.done(picks[-1].cycle, picks[-1].position)
    nxt = p.next()
    assert nxt is not None and nxt.cycle == 1


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), cycles=st.integers(1, 3), rnd_seed=st.integers(),
       added=st.lists(st.integers(0, 5), max_size=3))
def test_cycles_without_replacement(n: int, seed: int, cycles: int, rnd_seed: int, added: list[int]) -> None:
    """In every pass each unit comes exactly once, whatever order completions come back in, even when new
    files are discovered mid-pass."""
    units = [Unit(f"f{i // 3}", i % 3, i + 1) for i in range(n)]
    p = Planner(units, seed=seed)
    rnd = random.Random(rnd_seed)
    pending_adds = list(added)
    for c in range(cycles):
        seen: list[Unit] = []
        in_flight: list[Pick] = []
        while len(seen) < len(p):
            # discovery joins the current pass (before a pass's first pick the previous pass is still current)
            if pending_adds and (seen or c == 0) and rnd.random() < 0.2:
                k = pending_adds.pop()
                new = [Unit(f"new{len(p.units)}-{j}", 0, 1) for j in range(k)]
                assert p.add_units(new) == k
            pick = p.next()
            if pick is None:
                assert in_flight, "planner stalled with nothing in flight"
                x = in_flight.pop(rnd.randrange(len(in_flight)))
                p.done(x.cycle, x.position)
                continue
            assert pick.cycle == c
            seen.append(pick.unit)
            in_flight.append(pick)
            if rnd.random() < 0.5:
                x = in_flight.pop(rnd.randrange(len(in_flight)))
                p.done(x.cycle, x.position)
        assert Counter(seen) == Counter(p.units)
        finish(p, in_flight)
        assert p.cursor()["low"] == len(p) and p.cursor()["ahead"] == []
        assert p.coverage()["units_sampled"] == len(p)


def test_new_cycle_uses_a_new_permutation() -> None:
    units = make_units(6, 5)
    p = Planner(units, seed=3)
    orders = []
    for c in range(3):
        picks = drain(p)
        assert {x.cycle for x in picks} == {c}
        assert Counter(x.unit for x in picks) == Counter(units)
        orders.append([x.unit for x in picks])
        finish(p, picks)
    assert orders[0] != orders[1] != orders[2]


def test_units_added_after_a_finished_pass_join_that_pass() -> None:
    """The next pass starts lazily, at the next pick: units discovered in between are still sampled first."""
    units = make_units(2, 2)
    p = Planner(units, seed=1)
    finish(p, drain(p))
    new = [Unit("late", 0, 5)]
    p.add_units(new)
    x = p.next()
    assert x is not None and x.unit == new[0] and x.cycle == 0
    p.done(x.cycle, x.position)
    assert p.coverage()["units_sampled"] == len(units) + 1
    nxt = p.next()
    assert nxt is not None and nxt.cycle == 1


def test_units_added_mid_cycle_come_after_the_planned_ones() -> None:
    units = make_units(3, 2)
    p = Planner(units, seed=2)
    first = [p.next() for _ in range(2)]
    new = make_units(2, 2, seq0=10, prefix="new")
    assert p.add_units(new) == len(new)
    assert len(p) == len(units) + len(new)
    rest = drain(p)
    got = [x.unit for x in first] + [x.unit for x in rest]  # type: ignore[union-attr]
    assert Counter(got) == Counter(units + new)
    # the old units keep their planned order; the new segment follows them
    assert set(got[:len(units)]) == set(units)
    assert set(got[len(units):]) == set(new)
    assert p.coverage()["remote_units"] == len(units) + len(new)


# --- retry ----------------------------------------------------------------------------------------


def test_retry_hands_a_unit_out_again() -> None:
    p = Planner(make_units(3, 3), seed=1)
    a, b = p.next(), p.next()
    assert a is not None and b is not None
    p.retry(a)
    p.retry(a)  # twice: still once
    assert p.next() == a
    c = p.next()
    assert c is not None and c.position not in (a.position, b.position)
    rest = drain(p)
    assert a.position not in [x.position for x in rest]
    assert sorted([a.position, b.position, c.position] + [x.position for x in rest]) == list(range(len(p)))


def test_retry_after_everything_is_handed_out() -> None:
    p = Planner(make_units(2, 2))
    picks = drain(p)
    assert p.next() is None
    p.retry(picks[1])
    assert p.next() == picks[1]
    assert p.next() is None
    finish(p, picks)
    assert p.next().cycle == 1  # type: ignore[union-attr]


def test_retry_of_an_old_cycle_is_ignored() -> None:
    p = Planner([Unit("a", 0, 1)])
    x = p.next()
    assert x is not None
    p.done(x.cycle, x.position)
    y = p.next()
    assert y is not None and y.cycle == 1
    p.retry(x)  # cycle 0 is over
    assert p.next() is None


# --- cursor ------------------------------------------------------------------------------------


def test_cursor_after_is_pure_and_equals_done() -> None:
    p = Planner(make_units(), seed=4)
    picks = drain(p)
    for x in [picks[3], picks[0], picks[1], picks[7], picks[2]]:
        before = p.cursor()
        predicted = p.cursor_after(x.cycle, x.position)
        assert p.cursor() == before  # nothing changed
        p.done(x.cycle, x.position)
        assert p.cursor() == predicted
    cur = p.cursor()
    assert (cur["cycle"], cur["low"], cur["ahead"]) == (0, 4, [picks[7].position])
    # a completion of another cycle changes nothing
    assert p.cursor_after(5, 9) == cur


def test_restart_mid_cycle_continues_without_repeating_done_units() -> None:
    units = make_units(6, 4)
    p = Planner(units, seed=11)
    picks = [p.next() for _ in range(12)]
    assert all(x is not None for x in picks)
    finished = [picks[i] for i in (1, 0, 4, 7, 2, 10)]  # out of order; 3, 5, 6, 8, 9, 11 never finish
    persisted = None
    for x in finished:
        persisted = p.cursor_after(x.cycle, x.position)  # what the writer stores with the shard
        p.done(x.cycle, x.position)
    assert persisted == p.cursor()
    assert persisted["low"] == 3 and persisted["ahead"] == [4, 7, 10]

    q = Planner(units, seed=11, cursor=persisted)  # the restarted daemon
    assert q.cursor() == persisted
    rest = drain(q)
    done_units = [x.unit for x in finished]
    assert not set(done_units) & {x.unit for x in rest}
    assert Counter(done_units + [x.unit for x in rest]) == Counter(units)
    by_pos = {x.position: x.unit for x in rest}  # the dead process's unfinished picks come again
    for i in (3, 5, 6, 8, 9, 11):
        assert by_pos[picks[i].position] == picks[i].unit
    assert q.coverage()["units_sampled"] == len(finished)


def test_restart_with_new_files_keeps_the_cursor() -> None:
    units = make_units(4, 3)
    p = Planner(units, seed=6)
    picks = drain(p)
    finish(p, picks[:5])
    cur = p.cursor()
    new = make_units(2, 3, seq0=100, prefix="new")
    q = Planner(units + new, seed=6, cursor=cur)  # restarted, and discovery found two more files
    assert q.low == 5
    rest = drain(q)
    assert Counter([x.unit for x in picks[:5]] + [x.unit for x in rest]) == Counter(units + new)
    assert {x.cycle for x in rest} == {0}


def test_restart_at_a_cycle_boundary_starts_the_next_cycle() -> None:
    units = make_units(2, 3)
    p = Planner(units, seed=5)
    finish(p, drain(p))
    q = Planner(units, seed=5, cursor=p.cursor())
    picks = drain(q)
    assert {x.cycle for x in picks} == {1}
    assert Counter(x.unit for x in picks) == Counter(units)


def test_restart_in_a_later_cycle_keeps_the_cycle() -> None:
    units = make_units(3, 2)
    p = Planner(units, seed=9)
    finish(p, drain(p))
    first = [p.next() for _ in range(3)]
    p.done(first[1].cycle, first[1].position)  # type: ignore[union-attr]
    q = Planner(units, seed=9, cursor=p.cursor())
    assert q.cycle == 1
    rest = drain(q)
    assert {x.cycle for x in rest} == {1}
    assert first[1].unit not in [x.unit for x in rest]  # type: ignore[union-attr]
    assert len(rest) == len(units) - 1
    assert q.coverage()["units_sampled"] == len(units)  # a finished pass covers everything


def test_cursor_of_a_changed_unit_table_is_ignored() -> None:
    units = make_units(4, 3)
    p = Planner(units, seed=1)
    finish(p, drain(p)[:5])
    cur = p.cursor()
    for changed in (
        [Unit(u.path, u.row_group, u.rows + (i == 0)) for i, u in enumerate(units)],  # a row count changed
        units[1:],  # a planned unit is gone
        [units[1], units[0]] + units[2:],  # the planned order changed
    ):
        q = Planner(changed, seed=1, cursor=cur)
        assert cur["digest"] != q.cursor()["digest"] or q.cursor()["segments"] != cur["segments"]
        assert q.cursor()["low"] == 0 and q.cursor()["ahead"] == [] and q.cycle == 0
        assert Counter(x.unit for x in drain(q)) == Counter(changed)


def test_cursor_without_digest_or_segments_is_ignored() -> None:
    units = make_units(2, 2)
    assert Planner(units, cursor={"cycle": 3, "low": 2, "ahead": [3]}).low == 0
    cur = Planner(units).cursor()
    cur = dict(cur, low=2, digest="0" * 16)
    assert Planner(units, cursor=cur).low == 0


def test_cursor_from_another_node_split_is_ignored() -> None:
    units = make_units(8, 4)
    p = Planner(units, seed=1, node_rank=0, num_nodes=1)
    finish(p, drain(p)[:10])
    for rank, nodes in ((0, 2), (1, 2), (2, 3)):
        q = Planner(units, seed=1, node_rank=rank, num_nodes=nodes, cursor=p.cursor())
        assert q.low == 0 and q.ahead == set()
        assert Counter(x.unit for x in drain(q)) == Counter(q.units)


def test_cursor_from_another_seed_is_not_applied() -> None:
    units = make_units(5, 4)
    p = Planner(units, seed=1)
    done = drain(p)[:8]
    finish(p, done)
    q = Planner(units, seed=2, cursor=p.cursor())
    rest = drain(q)
    # Without replacement in this pass: the 8 sampled units must not come again, and none may be skipped.
    assert Counter([x.unit for x in done] + [x.unit for x in rest]) == Counter(units)


# --- nodes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_nodes", [1, 2, 3, 7])
def test_node_split_is_disjoint_covering_and_identical(num_nodes: int) -> None:
    units = make_units(20, 3)
    parts = [Planner(units, seed=42, node_rank=r, num_nodes=num_nodes).units for r in range(num_nodes)]
    assert Counter(u for part in parts for u in part) == Counter(units)
    assert all(part for part in parts)  # 60 units: every node gets some
    for r in range(num_nodes):  # every host derives the same split, whatever its seed
        assert Planner(units, seed=7, node_rank=r, num_nodes=num_nodes).units == parts[r]
        assert [u for u in units if node_of(u, num_nodes) == r] == parts[r]
    assert all(node_of(u, num_nodes) == node_of(u, num_nodes) for u in units)


def test_node_split_is_stable_when_files_are_added() -> None:
    units = make_units(10, 3)
    more = units + make_units(5, 3, seq0=50, prefix="late")
    for r in range(3):
        before = Planner(units, node_rank=r, num_nodes=3).units
        after = Planner(more, node_rank=r, num_nodes=3).units
        assert after[:len(before)] == before


def test_planners_on_three_nodes_split_a_cycle() -> None:
    units = make_units(10, 5)
    planners = [Planner(units, seed=8, node_rank=r, num_nodes=3) for r in range(3)]
    got = [[x.unit for x in drain(p)] for p in planners]
    assert Counter(u for g in got for u in g) == Counter(units)
    for a in range(3):
        for b in range(a + 1, 3):
            assert not set(got[a]) & set(got[b])
    assert sum(len(p) for p in planners) == len(units)
    assert all(p.coverage()["remote_units"] == len(units) for p in planners)
    # units discovered later go to their own node only
    new = make_units(4, 2, seq0=9, prefix="x")
    assert sum(p.add_units(new) for p in planners) == len(new)


def test_bad_node_rank() -> None:
    with pytest.raises(ValueError):
        Planner(make_units(), node_rank=3, num_nodes=3)
    with pytest.raises(ValueError):
        Planner(make_units(), node_rank=-1, num_nodes=2)


def test_no_units() -> None:
    p = Planner([])
    assert p.next() is None
    cov = p.coverage()
    assert cov["units"] == 0 and cov["unit_fraction"] == 0.0 and cov["row_fraction"] == 0.0


# --- coverage ---------------------------------------------------------------------------------------


def test_coverage_numbers() -> None:
    units = [Unit("a", 0, 10), Unit("a", 1, 20), Unit("b", 0, 30), Unit("c", 0, 40)]
    p = Planner(units, seed=0)
    cov = p.coverage()
    assert {k: cov[k] for k in ("cycle", "units", "units_sampled", "rows", "rows_sampled", "unit_fraction",
                                "row_fraction", "remote_units")} == \
        {"cycle": 0, "units": 4, "units_sampled": 0, "rows": 100, "rows_sampled": 0,
         "unit_fraction": 0.0, "row_fraction": 0.0, "remote_units": 4}
    picks = drain(p)
    assert p.coverage()["units_sampled"] == 0  # handed out is not sampled
    p.done(picks[2].cycle, picks[2].position)  # out of order: counted through `ahead`
    cov = p.coverage()
    assert cov["units_sampled"] == 1
    assert cov["rows_sampled"] == picks[2].unit.rows
    assert cov["row_fraction"] == pytest.approx(picks[2].unit.rows / 100)
    p.done(picks[0].cycle, picks[0].position)
    cov = p.coverage()
    assert cov["units_sampled"] == 2
    assert cov["rows_sampled"] == picks[0].unit.rows + picks[2].unit.rows
    assert cov["unit_fraction"] == 0.5
    finish(p, [picks[1], picks[3]])
    cov = p.coverage()
    assert cov["units_sampled"] == 4 and cov["rows_sampled"] == 100 and cov["row_fraction"] == 1.0
    p.next()  # a new pass: coverage stays full
    cov = p.coverage()
    assert cov["cycle"] == 1 and cov["unit_fraction"] == 1.0 and cov["rows_sampled"] == 100


def test_coverage_counts_units_added_after_the_first_pass_as_unsampled() -> None:
    units = [Unit("a", 0, 10), Unit("b", 0, 30)]
    p = Planner(units, seed=0)
    finish(p, drain(p))
    assert p.next() is not None  # pass 1 begins
    p.add_units([Unit("c", 0, 60)])  # discovered now, never sampled
    cov = p.coverage()
    assert cov["units"] == 3
    assert cov["units_sampled"] == 2
    assert cov["rows_sampled"] == 40 and cov["row_fraction"] == pytest.approx(0.4)
