"""Leases: a reader's claim on a sealed epoch. Every shard an epoch with a live lease names is pinned.

Leases expire after their TTL unless heartbeated, so a crashed trainer cannot pin
the cache forever. Each lease is persisted as its own record (by the writer) when it is
taken, and dropped when it is released or expires; after a daemon restart every persisted
lease gets a fresh TTL, so readers that were mid-epoch keep their shards while they
reconnect. The table is capped per job and per host: a take past a cap is refused (429).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from samplecache_service.errors import Gone, Invalid, NotFound, ServiceError, TooMany

EXPIRED_KEPT = 10_000


@dataclass
class Lease:
    id: str
    epoch: int
    ttl: float
    expires_at: float
    created_at: float
    holder: str | None = None
    job: str | None = None  # the job whose reader holds it
    run: str | None = None  # that job's run
    job_epoch: int | None = None  # that job's epoch number for this daemon epoch
    read: int = 0  # samples this reader has read (reported with heartbeats and the release)
    read_sources: dict[str, int] = field(default_factory=dict)  # of them, per source (a mixture's reader)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _count(lease: Lease, read: int | None, read_sources: dict[str, int] | None) -> None:
    """A reader's report: counts only grow (a late heartbeat never takes back what a newer one said)."""
    if read is not None:
        lease.read = max(lease.read, int(read))
    for name, n in (read_sources or {}).items():
        lease.read_sources[name] = max(lease.read_sources.get(name, 0), int(n))


class LeaseTable:
    def __init__(self, default_ttl: float, max_ttl: float = 3600.0, clock: Any = time.time,
                 max_leases: int = 16384, max_per_job: int = 4096) -> None:
        self.default_ttl, self.max_ttl, self.clock = default_ttl, max_ttl, clock
        self.max_leases, self.max_per_job = max_leases, max_per_job
        self._leases: dict[str, Lease] = {}
        self._per_job: Counter[str | None] = Counter()  # leases held (live or not yet expired) by job
        self._expired: OrderedDict[str, Lease] = OrderedDict()  # recently expired, to answer 410 not 404
        self._lock = threading.Lock()
        self.expired_total = 0
        self._ended: list[Lease] = []  # expired, not yet handed out by expire()

    def _add(self, lease: Lease) -> None:
        self._leases[lease.id] = lease
        self._per_job[lease.job] += 1

    def _drop(self, lease_id: str) -> Lease:
        lease = self._leases.pop(lease_id)
        self._per_job[lease.job] -= 1
        if not self._per_job[lease.job]:
            del self._per_job[lease.job]
        return lease

    def _forget(self, lease: Lease) -> None:
        """Move an expired lease to the bounded record of expired ones (lock held)."""
        self._drop(lease.id)
        self._expired[lease.id] = lease
        self._ended.append(lease)
        while len(self._expired) > EXPIRED_KEPT:
            self._expired.popitem(last=False)
        self.expired_total += 1

    def _missing(self, epoch: int, lease_id: str, now: float) -> ServiceError:
        gone = self._expired.get(lease_id)
        if gone is not None and gone.epoch == epoch:
            return Gone(f"lease {lease_id!r} on epoch {epoch} expired {now - gone.expires_at:.1f}s "
                                   f"ago; its shards may be evicted: take a new lease")
        return NotFound(f"no lease {lease_id!r} on epoch {epoch} (released or never taken)")

    def load(self, saved: Iterable[dict[str, Any]]) -> None:
        now = self.clock()
        with self._lock:
            for d in saved:
                lease = Lease(**d)
                lease.expires_at = max(lease.expires_at, now + lease.ttl)
                self._add(lease)

    def take(self, epoch: int, ttl: float | None = None, holder: str | None = None, job: str | None = None,
             run: str | None = None, job_epoch: int | None = None) -> Lease:
        ttl = self.default_ttl if ttl is None else ttl
        if not 0 < ttl <= self.max_ttl:
            raise Invalid(f"ttl must be in (0, {self.max_ttl}] seconds, not {ttl}")
        now = self.clock()
        lease = Lease(secrets.token_hex(8), epoch, ttl, now + ttl, now, holder, job, run, job_epoch)
        with self._lock:
            if len(self._leases) >= self.max_leases:
                self._collect(now)
            if len(self._leases) >= self.max_leases:
                raise TooMany(f"the daemon holds {len(self._leases)} leases, its limit (--max-leases): release "
                              f"leases readers no longer use, or wait for them to expire", retry_after=ttl)
            if job is not None and self._per_job[job] >= self.max_per_job:
                self._collect(now)
            if job is not None and self._per_job[job] >= self.max_per_job:
                raise TooMany(f"job {job!r} holds {self._per_job[job]} leases, the limit per job "
                              f"(--max-leases-per-job): its readers take leases they do not release",
                              retry_after=ttl)
            self._add(lease)
        return lease

    def heartbeat(self, epoch: int, lease_id: str, read: int | None = None,
                  read_sources: dict[str, int] | None = None) -> Lease:
        now = self.clock()
        with self._lock:
            lease = self._leases.get(lease_id)
            if lease is not None and lease.epoch == epoch and lease.expires_at <= now:
                self._forget(lease)
            lease = self._leases.get(lease_id)
            if lease is None or lease.epoch != epoch:
                raise self._missing(epoch, lease_id, now)
            lease.expires_at = now + lease.ttl
            _count(lease, read, read_sources)
            return lease

    def release(self, epoch: int, lease_id: str, read: int | None = None,
                read_sources: dict[str, int] | None = None) -> Lease:
        with self._lock:
            lease = self._leases.get(lease_id)
            if lease is None or lease.epoch != epoch:
                raise self._missing(epoch, lease_id, self.clock())
            _count(lease, read, read_sources)
            return self._drop(lease_id)

    def _collect(self, now: float) -> None:
        """Forget the leases whose TTL ran out (lock held)."""
        for lease in [l for l in self._leases.values() if l.expires_at <= now]:
            self._forget(lease)

    def expire(self) -> list[Lease]:
        """Drop expired leases; returns them (and those a heartbeat or a take found expired since the last call)."""
        with self._lock:
            self._collect(self.clock())
            gone, self._ended = self._ended, []
        return gone

    def live(self) -> list[Lease]:
        now = self.clock()
        with self._lock:
            return [l for l in self._leases.values() if l.expires_at > now]

    def epochs(self) -> set[int]:
        return {l.epoch for l in self.live()}

    def get(self, lease_id: str) -> Lease | None:
        with self._lock:
            return self._leases.get(lease_id)

    def expired_for(self, job: str, job_epoch: int) -> Lease | None:
        """The latest recently expired lease of ``job`` on its epoch ``job_epoch``, if any."""
        with self._lock:
            found = [l for l in self._expired.values() if l.job == job and l.job_epoch == job_epoch]
        return max(found, key=lambda l: l.expires_at) if found else None

    def jobs(self) -> set[str]:
        """Jobs with a live lease."""
        return {l.job for l in self.live() if l.job is not None}

    def summary(self, shown: int) -> tuple[list[Lease], int, dict[str, int]]:
        """The ``shown`` newest live leases, how many live ones there are, and how many each job holds."""
        live = self.live()
        per_job = Counter(l.job for l in live if l.job is not None)
        return sorted(live, key=lambda l: l.created_at, reverse=True)[:shown], len(live), dict(per_job)
