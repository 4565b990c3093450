"""History: the recent past of a few numbers of the daemon, for the charts of the status page (``page.py``).

A bounded ring of ``Point`` samples (by default the last 2 hours at one point every 5 s) taken by a background
loop of the daemon (``Recorder.step`` under ``Health.run_loop``). A point holds levels (cache bytes, budget,
coverage, each source's resident bytes) and running counters (bytes and samples ingested, shards evicted, remote
bytes read); rates are differences of counters between points, so a chart never depends on how often it is looked at.
The ring's length is fixed, and a point holds one number per source that holds shards, so memory stays bounded.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from samplecache_service.sampling.scheduler import Scheduler
from samplecache_service.sampling.traffic import Traffic
from samplecache_service.store.budget import Budget
from samplecache_service.store.catalog import Catalog

INTERVAL_S = 5.0      # one point every this many seconds
KEEP_S = 2 * 3600.0   # points older than this fall out of the ring


@dataclass(frozen=True)
class Point:
    t: float                      # Unix time
    bytes: int                    # resident sample bytes
    max_bytes: int                # the budget then
    ingested_bytes: int           # counter: sample bytes ingested since start
    ingested_samples: int         # counter: samples ingested since start
    evictions: int                # counter: shards evicted since start
    remote_bytes: int             # counter: bytes fetched from the remote since start
    coverage: float | None        # rows of the remote sampled this pass, 0..1 (None: not known yet)
    cycle: int                    # the pass over the remote (0: the first)
    sources: tuple[tuple[str, int], ...] = ()  # (source, its resident bytes) of each source that holds a shard

    def source_bytes(self, name: str) -> int:
        """What ``name`` held then (0 when it held nothing)."""
        return next((b for n, b in self.sources if n == name), 0)


def rate(a: Point, b: Point, counter: Callable[[Point], int]) -> float:
    """Per second, between two points (0 when no time passed)."""
    dt = b.t - a.t
    return (counter(b) - counter(a)) / dt if dt > 0 else 0.0


class History:
    """A thread-safe ring of points, oldest first."""

    def __init__(self, interval: float = INTERVAL_S, keep: float = KEEP_S) -> None:
        self.interval = interval
        self._points: collections.deque[Point] = collections.deque(maxlen=max(2, int(keep / interval) + 1))
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._points.maxlen or 0

    def add(self, point: Point) -> None:
        with self._lock:
            self._points.append(point)

    def points(self) -> list[Point]:
        with self._lock:
            return list(self._points)


class IngestTotals:
    """Running totals of what was ingested, from the scheduler's log of recent ingests ``(time, rows, bytes)``
    (a bounded deque appended on the scheduler thread): each entry newer than the last one counted is added."""

    def __init__(self) -> None:
        self.samples = 0
        self.bytes = 0
        self._seen_until = float("-inf")

    def peek(self, log: Iterable[tuple[float, int, int]]) -> tuple[int, int, float]:
        """(samples, bytes, newest time) counting ``log``'s new entries, without keeping them."""
        samples, nbytes, until = self.samples, self.bytes, self._seen_until
        for t, rows, size in list(log):
            if t > self._seen_until:
                samples += rows
                nbytes += size
                until = max(until, t)
        return samples, nbytes, until

    def count(self, log: Iterable[tuple[float, int, int]]) -> tuple[int, int]:
        self.samples, self.bytes, self._seen_until = self.peek(log)
        return self.samples, self.bytes


class Recorder:
    """Samples a daemon into its ``History``: ``step`` adds a point (the history loop's body), ``now`` makes one
    for the present without keeping it (the page's last point)."""

    def __init__(self, catalog: Catalog, budget: Budget, schedulers: Callable[[], dict[str, Scheduler]],
                 traffic: Traffic, history: History, clock: Callable[[], float] = time.time) -> None:
        """``schedulers``: each source's, as the daemon has them now (sources change while it runs)."""
        self.catalog, self.budget, self.schedulers, self.traffic = catalog, budget, schedulers, traffic
        self.history, self.clock = history, clock
        self._totals: dict[str, IngestTotals] = {}  # per source: each scheduler's log has its own order
        self._evicted: dict[str, int] = {}  # the evictions counted by sources since removed
        self._lock = threading.Lock()

    def step(self) -> None:
        with self._lock:
            self.history.add(self._point(keep=True))

    def now(self) -> Point:
        with self._lock:
            return self._point(keep=False)

    def _point(self, keep: bool) -> Point:
        schedulers = self.schedulers()
        samples = nbytes = 0
        for name, s in schedulers.items():
            totals = self._totals.setdefault(name, IngestTotals())
            got = totals.count(s.ingests) if keep else totals.peek(s.ingests)[:2]
            samples, nbytes = samples + got[0], nbytes + got[1]
            self._evicted[name] = s.evicted_shards
        gone = [t for n, t in self._totals.items() if n not in schedulers]  # removed sources: what they ingested
        samples += sum(t.samples for t in gone)
        nbytes += sum(t.bytes for t in gone)
        covs = [c for c in (s.coverage() for s in schedulers.values()) if c]
        cov = covs[0] if len(covs) == 1 else ({"row_fraction": sum(c["rows_sampled"] for c in covs) / max(
            1, sum(c["rows"] for c in covs)), "cycle": min(c["cycle"] for c in covs)} if covs else None)
        return Point(t=self.clock(), bytes=self.catalog.resident_bytes, max_bytes=self.budget.max_bytes,
                     ingested_bytes=nbytes, ingested_samples=samples, evictions=sum(self._evicted.values()),
                     remote_bytes=self.traffic.total(),
                     coverage=float(cov["row_fraction"]) if cov else None, cycle=int(cov["cycle"]) if cov else 0,
                     sources=tuple((n, r.bytes) for n, r in self.catalog.resident_sources().items()))
