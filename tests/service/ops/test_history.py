"""service/samplecache_service/ops/history.py: the bounded ring of points, the running ingest totals and rates
from counters."""

from __future__ import annotations

from samplecache_service.ops.history import History, IngestTotals, Point, rate


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
