"""Runtime settings changed over HTTP (``PATCH /v1/config``): validated against what the cache holds."""

from __future__ import annotations

from samplecache_service.config.mapsize import restart_advice
from samplecache_service.config.settings import PACING
from samplecache_service.epochs.manager import EpochManager
from samplecache_service.errors import Conflict, Invalid
from samplecache_service.sampling.pacing import Pacer
from samplecache_service.store.budget import Budget
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.eviction import POLICIES


def configure(budget: Budget, catalog: Catalog, epochs: EpochManager, pacer: Pacer, map_size: int,
              max_bytes: int | None = None, policy: str | None = None,
              min_free_disk: int | None = None, epoch_max_samples: int | None = None, pacing: str | None = None,
              replace_per_epoch: float | None = None, max_ingest_rate: int | None = None) -> None:
    """Change settings at runtime (validated; raises errors.Invalid or errors.Conflict with what fits). Runs on the
    scheduler's thread (``Daemon.configure``), never on a request's."""
    if policy is not None and policy not in POLICIES:
        raise Invalid(f"unknown eviction policy {policy!r}; choose one of {sorted(POLICIES)}")
    if pacing is not None and pacing not in PACING:
        raise Invalid(f"unknown pacing {pacing!r}; choose one of {list(PACING)}")
    if max_bytes is not None:
        largest = max((s.bytes for s in catalog.shards()), default=0)
        pinned = epochs.pinned_shards()
        pinned_bytes = sum(s.bytes for s in catalog.shards() if s.id in pinned)
        ceiling = (map_size - (1 << 30)) // 2
        if max_bytes <= 0:
            raise Invalid("max_bytes must be positive")
        if max_bytes < largest:
            raise Conflict(f"max_bytes {max_bytes} is smaller than one shard ({largest} bytes): "
                                   f"at least {largest} fits")
        if max_bytes < pinned_bytes:
            raise Conflict(f"max_bytes {max_bytes} is less than the {pinned_bytes} bytes pinned by "
                                   f"live leases on epochs {sorted(epochs.pinned_epochs())}: at least "
                                   f"{pinned_bytes} fits now")
        if max_bytes > ceiling:
            # never advise a restart with a budget the restart could not map
            raise Conflict(f"max_bytes {max_bytes} is beyond what this run's LMDB map allows "
                           f"({ceiling}); {restart_advice(max_bytes, map_size)}")
    if max_bytes is not None:
        budget.max_bytes = max_bytes
    if policy is not None:
        budget.policy = policy
    if min_free_disk is not None:
        budget.min_free_disk = min_free_disk
    if epoch_max_samples is not None:
        epochs.rules.max_samples = epoch_max_samples
    pacer.configure(pacing, replace_per_epoch, max_ingest_rate)
