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
from dataclasses import asdict, dataclass
from typing import Any, Iterable


class LeaseError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Lease:
    id: str
    epoch: int
    ttl: float
    expires_at: float
    created_at: float
    holder: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LeaseTable:
    def __init__(self, default_ttl: float, max_ttl: float = 3600.0, clock: Any = time.time) -> None:
        self.default_ttl, self.max_ttl, self.clock = default_ttl, max_ttl, clock
        self._leases: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self.expired_total = 0

    def load(self, saved: Iterable[dict[str, Any]]) -> None:
        now = self.clock()
        with self._lock:
            for d in saved:
                lease = Lease(**d)
                lease.expires_at = max(lease.expires_at, now + lease.ttl)
                self._leases[lease.id] = lease

    def take(self, epoch: int, ttl: float | None = None, holder: str | None = None) -> Lease:
        ttl = self.default_ttl if ttl is None else ttl
        if not 0 < ttl <= self.max_ttl:
            raise LeaseError(422, f"ttl must be in (0, {self.max_ttl}] seconds, not {ttl}")
        now = self.clock()
        lease = Lease(secrets.token_hex(8), epoch, ttl, now + ttl, now, holder)
        with self._lock:
            self._leases[lease.id] = lease
        return lease

    def heartbeat(self, epoch: int, lease_id: str) -> Lease:
        now = self.clock()
        with self._lock:
            lease = self._leases.get(lease_id)
            if lease is None or lease.epoch != epoch:
                raise LeaseError(404, f"no lease {lease_id!r} on epoch {epoch} (released, expired and "
                                      f"collected, or never taken): take a new one")
            if lease.expires_at <= now:
                del self._leases[lease_id]
                self.expired_total += 1
                raise LeaseError(410, f"lease {lease_id!r} on epoch {epoch} expired "
                                      f"{now - lease.expires_at:.1f}s ago; its shards may be evicted")
            lease.expires_at = now + lease.ttl
            return lease

    def release(self, epoch: int, lease_id: str) -> Lease:
        with self._lock:
            lease = self._leases.get(lease_id)
            if lease is None or lease.epoch != epoch:
                raise LeaseError(404, f"no lease {lease_id!r} on epoch {epoch}")
            return self._leases.pop(lease_id)

    def expire(self) -> list[Lease]:
        """Drop expired leases; returns them."""
        now = self.clock()
        with self._lock:
            gone = [l for l in self._leases.values() if l.expires_at <= now]
            for lease in gone:
                del self._leases[lease.id]
            self.expired_total += len(gone)
        return gone

    def live(self) -> list[Lease]:
        now = self.clock()
        with self._lock:
            return [l for l in self._leases.values() if l.expires_at > now]

    def epochs(self) -> set[int]:
        return {l.epoch for l in self.live()}

    def saved(self) -> list[dict[str, Any]]:
        with self._lock:
            return [l.to_json() for l in self._leases.values()]
