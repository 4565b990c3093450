"""service/samplecache_service/config/mapsize.py: the LMDB map a budget needs, what this machine can map, and the
largest budget that works."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from samplecache_service.config.mapsize import (
    ADDRESS_SPACE,
    MAX_BUDGET,
    GiB,
    budget_for,
    can_map,
    fits,
    largest_budget,
    largest_map,
    map_problem,
    map_size_for,
    restart_advice,
)

TiB = 1 << 40


def below(limit: int):  # type: ignore[no-untyped-def]
    """A machine that maps up to ``limit`` bytes."""
    return lambda size: size <= limit


@pytest.mark.parametrize("budget", [4096, 10 * GiB, 7 * TiB + 12345, MAX_BUDGET])
def test_budget_for_inverts_map_size_for_in_whole_gib(budget: int) -> None:
    got = budget_for(map_size_for(budget))
    assert got <= budget and budget - got < GiB and got % GiB == 0
    assert map_size_for(MAX_BUDGET) <= ADDRESS_SPACE < map_size_for(MAX_BUDGET + GiB)


@pytest.mark.parametrize("limit", [GiB, 3 * GiB + 17, 85 * TiB + 5, ADDRESS_SPACE])
def test_largest_map_finds_the_limit_within_a_gib(limit: int) -> None:
    got = largest_map(below(limit))
    assert got <= limit <= got + GiB


def test_the_largest_budget_fits_with_its_headroom_and_a_gib_more_does_not() -> None:
    limit = 85 * TiB
    best = largest_budget(limit)
    assert fits(map_size_for(best), below(limit))
    assert not fits(map_size_for(best + 2 * GiB), below(limit))


def test_map_problem_names_the_setting_and_a_budget_that_works() -> None:
    machine = below(85 * TiB)
    assert map_problem(10 * GiB, machine) is None
    problem = map_problem(30 * 10**12, machine)  # 30TB: a 120 TB map
    assert problem is not None
    assert "--max-bytes" in problem and "30000000000000" in problem
    advised = int(problem.rsplit("--max-bytes ", 1)[1].split("GiB")[0]) * GiB
    assert map_problem(advised, machine) is None  # the advice is itself accepted
    assert map_problem(MAX_BUDGET + GiB, lambda size: True) is not None  # beyond any 64-bit process


def test_restart_advice_never_names_a_budget_a_restart_cannot_map() -> None:
    machine = below(TiB)
    in_use = map_size_for(10 * GiB)
    assert restart_advice(100 * GiB, in_use, machine) == f"restart the daemon with --max-bytes {100 * GiB}"
    advice = restart_advice(30 * TiB, in_use, machine)
    assert "restart the daemon with" not in advice and str(30 * TiB) in advice
    advised = int(advice.rsplit("--max-bytes ", 1)[1].split("GiB")[0]) * GiB
    assert 0 < advised < 30 * TiB and fits(map_size_for(advised), machine)


def test_this_machine_the_probe_and_lmdb_agree(tmp_path: Path) -> None:
    """Real: the probe's answer is what LMDB accepts, and the advised budget's map opens."""
    assert can_map(GiB) and not can_map(1 << 62)
    best = largest_budget(largest_map())
    assert best >= GiB
    env = lmdb.open(str(tmp_path), map_size=map_size_for(best), subdir=True)
    assert env.info()["map_size"] == map_size_for(best)
    env.close()
    with pytest.raises((lmdb.MemoryError, OverflowError)):
        lmdb.open(str(tmp_path / "too-large"), map_size=largest_map() + 64 * GiB, subdir=True)
