"""Leases: a reader's claim on a sealed epoch. Every shard an epoch with a live lease names is pinned.

Leases expire after their TTL unless heartbeated, so a crashed trainer cannot pin
the cache forever. The table is persisted (by the writer) when leases are taken
or released; after a daemon restart every persisted lease gets a fresh TTL, so
readers that were mid-epoch keep their shards while they reconnect.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from samplecache_service.errors import Gone, Invalid, NotFound, ServiceError

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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LeaseTable:
    def __init__(self, default_ttl: float, max_ttl: float = 3600.0, clock: Any = time.time) -> None:
        self.default_ttl, self.max_ttl, self.clock = default_ttl, max_ttl, clock
        self._leases: dict[str, Lease] = {}
        self._expired: OrderedDict[str, Lease] = OrderedDict()  # recently expired, to answer 410 not 404
        self._lock = threading.Lock()
        self.expired_total = 0
        self._ended: list[Lease] = []  # expired, not yet handed out by expire()

    def _forget(self, lease: Lease) -> None:
        """Move an expired lease to the bounded record of expired ones (lock held)."""
        self._leases.pop(lease.id, None)
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
                self._leases[lease.id] = lease

    def take(self, epoch: int, ttl: float | None = None, holder: str | None = None, job: str | None = None,
             run: str | None = None, job_epoch: int | None = None) -> Lease:
        ttl = self.default_ttl if ttl is None else ttl
        if not 0 < ttl <= self.max_ttl:
            raise Invalid(f"ttl must be in (0, {self.max_ttl}] seconds, not {ttl}")
        now = self.clock()
        lease = Lease(secrets.token_hex(8), epoch, ttl, now + ttl, now, holder, job, run, job_epoch)
        with self._lock:
            self._leases[lease.id] = lease
        return lease

    def heartbeat(self, epoch: int, lease_id: str, read: int | None = None) -> Lease:
        now = self.clock()
        with self._lock:
            lease = self._leases.get(lease_id)
            if lease is not None and lease.epoch == epoch and lease.expires_at <= now:
                self._forget(lease)
            lease = self._leases.get(lease_id)
            if lease is None or lease.epoch != epoch:
                raise self._missing(epoch, lease_id, now)
            lease.expires_at = now + lease.ttl
            if read is not None:
                lease.read = max(lease.read, int(read))
            return lease

    def release(self, epoch: int, lease_id: str, read: int | None = None) -> Lease:
        with self._lock:
            lease = self._leases.get(lease_id)
            if lease is None or lease.epoch != epoch:
                raise self._missing(epoch, lease_id, self.clock())
            if read is not None:
                lease.read = max(lease.read, int(read))
            return self._leases.pop(lease_id)

    def expire(self) -> list[Lease]:
        """Drop expired leases; returns them (and those a heartbeat found expired since the last call)."""
        now = self.clock()
        with self._lock:
            for lease in [l for l in self._leases.values() if l.expires_at <= now]:
                self._forget(lease)
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

    def saved(self) -> list[dict[str, Any]]:
        with self._lock:
            return [l.to_json() for l in self._leases.values()]
