"""service/samplecache_service/ops/control.py: PATCH /v1/config (and a reload) refuse a budget beyond this run's
LMDB map, and never advise a restart with a budget the restart could not map either."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from samplecache_service.config import mapsize
from samplecache_service.config.mapsize import GiB, map_size_for
from samplecache_service.epochs.manager import EpochManager
from samplecache_service.errors import Conflict
from samplecache_service.ops.control import configure
from samplecache_service.sampling.pacing import Pacer
from samplecache_service.store.budget import Budget
from samplecache_service.store.catalog import Catalog

TiB = 1 << 40


def _configure(max_bytes: int, budget: Budget) -> None:
    catalog = SimpleNamespace(shards=lambda: [])
    epochs = SimpleNamespace(pinned_shards=lambda: set(), pinned_epochs=lambda: set())
    configure(budget, cast(Catalog, catalog), cast(EpochManager, epochs), Pacer("epoch", 0.2, 0),
              map_size_for(10 * GiB), max_bytes=max_bytes)


@pytest.fixture()
def machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine maps 1 TiB at most."""
    monkeypatch.setattr(mapsize, "can_map", lambda size: size <= TiB)


def test_a_budget_within_the_map_is_applied(machine: None) -> None:
    budget = Budget(10 * GiB, GiB, "fifo")
    _configure(20 * GiB, budget)
    assert budget.max_bytes == 20 * GiB


def test_beyond_the_map_a_restart_is_advised_only_when_it_could_map_the_budget(machine: None) -> None:
    budget = Budget(10 * GiB, GiB, "fifo")
    with pytest.raises(Conflict) as e:
        _configure(100 * GiB, budget)
    assert f"restart the daemon with --max-bytes {100 * GiB}" in str(e.value)
    with pytest.raises(Conflict) as e:
        _configure(30 * TiB, budget)
    text = str(e.value)
    assert "restart the daemon with" not in text and "could not map it either" in text, text
    advised = int(text.rsplit("--max-bytes ", 1)[1].split("GiB")[0]) * GiB
    assert 0 < advised and map_size_for(advised) <= TiB
    assert budget.max_bytes == 10 * GiB  # nothing applied
