"""service/samplecache_service/ops/history.py: the bounded ring of points, the running ingest totals, rates
from counters, and each source's bytes in every point."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from samplecache_service.ops.history import History, IngestTotals, Point, Recorder, rate
from samplecache_service.store.catalog import Resident


def point(t: float, ingested: int = 0, evictions: int = 0) -> Point:
    return Point(t=t, bytes=0, max_bytes=100, ingested_bytes=ingested, ingested_samples=0, evictions=evictions,
                 remote_bytes=0, coverage=None, cycle=0)


def test_the_ring_keeps_the_latest_points_within_its_span() -> None:
    h = History(interval=5.0, keep=60.0)
    assert h.capacity == 13
    for i in range(40):
        h.add(point(float(i)))
    got = h.points()
    assert [p.t for p in got] == [float(i) for i in range(27, 40)]
    got.clear()
    assert len(h.points()) == 13, "points() hands out a copy"


def test_rates_are_counter_differences_over_time() -> None:
    a, b = point(10.0, ingested=1000, evictions=2), point(15.0, ingested=6000, evictions=7)
    assert rate(a, b, lambda p: p.ingested_bytes) == 1000.0
    assert rate(a, b, lambda p: p.evictions) == 1.0
    assert rate(a, a, lambda p: p.evictions) == 0.0


def test_ingest_totals_count_each_entry_of_the_recent_log_once() -> None:
    totals = IngestTotals()
    log = [(1.0, 10, 100), (2.0, 20, 200)]
    assert totals.count(log) == (30, 300)
    assert totals.count(log) == (30, 300), "entries seen before are not counted again"
    log = log[1:] + [(3.0, 5, 50), (4.0, 1, 10)]  # the bounded log dropped its oldest entry
    assert totals.peek(log)[:2] == (36, 360)
    assert (totals.samples, totals.bytes) == (30, 300), "peek keeps nothing"
    assert totals.count(log) == (36, 360)


def test_each_point_holds_each_sources_bytes() -> None:
    held = {"web": Resident(shards=3, rows=30, bytes=3000), "code": Resident(shards=1, rows=5, bytes=500)}
    catalog: Any = SimpleNamespace(resident_bytes=3500, resident_sources=lambda: dict(held))
    scheduler: Any = SimpleNamespace(ingests=[], coverage=lambda: None, evicted_shards=0)
    budget: Any = SimpleNamespace(max_bytes=10_000)
    traffic: Any = SimpleNamespace(total=lambda: 0)
    clock = iter(range(100))
    h = History(interval=5.0, keep=10.0)
    r = Recorder(catalog, budget, lambda: {"web": scheduler}, traffic, h, clock=lambda: float(next(clock)))
    r.step()
    held["web"] = Resident(shards=4, rows=40, bytes=4000)
    del held["code"]  # evicted: it holds nothing now
    r.step()
    first, second = h.points()
    assert first.sources == (("web", 3000), ("code", 500))
    assert (first.source_bytes("web"), first.source_bytes("code"), first.source_bytes("gone")) == (3000, 500, 0)
    assert (second.source_bytes("web"), second.source_bytes("code")) == (4000, 0)
    now = r.now()
    assert now.sources == (("web", 4000),) and len(h.points()) == 2, "now() keeps nothing"
    for _ in range(10):  # the ring stays bounded, each point with its sources
        r.step()
    got = h.points()
    assert len(got) == h.capacity == 3 and all(p.source_bytes("web") == 4000 for p in got)


def test_a_point_counts_every_sources_ingests_and_evictions() -> None:
    """Each source's scheduler keeps its own log; a source removed keeps what it ingested in the totals."""
    catalog: Any = SimpleNamespace(resident_bytes=0, resident_sources=lambda: {})
    web: Any = SimpleNamespace(ingests=[(1.0, 10, 100)], coverage=lambda: None, evicted_shards=2)
    code: Any = SimpleNamespace(ingests=[(0.5, 4, 40)], coverage=lambda: None, evicted_shards=1)
    live = {"web": web, "code": code}
    r = Recorder(catalog, SimpleNamespace(max_bytes=1), lambda: dict(live), SimpleNamespace(total=lambda: 0),
                 History(interval=5.0, keep=10.0), clock=lambda: 0.0)
    r.step()
    code.ingests.append((0.7, 1, 10))  # later than web's newest seen, but earlier in time: still counted
    del live["code"]
    r.step()
    live["code"] = code
    p = r.now()
    assert (p.ingested_samples, p.ingested_bytes, p.evictions) == (15, 150, 3)
