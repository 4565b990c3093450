"""Epochs: seal epoch N's manifest on first request; every later caller gets the same bytes.

Also the pins, which follow readers: every shard named by an epoch with a live lease must not be evicted, nor
one named by a new epoch (just sealed, or just mapped by a job) before its first lease, for at most PIN_GRACE_S
(the gap between a reader getting a manifest and taking its lease). A released lease unpins at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from samplecache.format.manifest import DEFAULT_SOURCE, Manifest, pack_indices
from samplecache_service.epochs.jobs import PIN_GRACE_S, JobTable
from samplecache_service.epochs.leases import LeaseTable
from samplecache_service.errors import Conflict, Gone, NotReady
from samplecache_service.store.budget import Budget
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.eviction import evict_first
from samplecache_service.store.shardtable import Columns
from samplecache_service.store.writer import Writer

log = logging.getLogger("samplecache.epochs")

# Epochs sealed within the lease TTL that granted a share of replacement and have no lease yet: past this many, a new
# epoch grants none until a reader leases one (a loop of manifest requests buys no remote traffic).
UNREAD_GRANTS = 2


def select_shards(rows: np.ndarray, max_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The positions of the shards (of ``rows`` samples each, in id order) an epoch names: every one, or with a
    cap a seeded random subset (at least one shard), ascending."""
    if max_samples <= 0 or int(rows.sum()) <= max_samples:
        return np.arange(len(rows))
    picked: list[int] = []
    total = 0
    for i in np.random.default_rng([seed, epoch, 7]).permutation(len(rows)).tolist():
        r = int(rows[i])
        if picked and total + r > max_samples:
            continue
        picked.append(i)
        total += r
    return np.sort(np.array(picked, np.int64))


def build_manifest(epoch: int, shards: Columns, schema: dict[str, Any], lmdb_path: str,
                   map_size: int, seed: int, source: str, previous: np.ndarray, remote_bytes: int = 0,
                   skipped_columns: dict[str, str] | None = None, cache_id: str = "",
                   sources: dict[str, dict[str, Any]] | None = None) -> Manifest:
    """The manifest of ``epoch``: ``shards`` in id (= age) order (``previous``: the previous epoch's shard ids,
    for its new samples). ``sources``: each named source's schema, skipped columns and URL; a one-source daemon
    (only ``default``) leaves them out, as before sources had names."""
    named = dict(sources or {})
    own = [shards.sources[i] for i in np.unique(shards.source).tolist()]
    if set(named) <= {DEFAULT_SOURCE} and set(own) <= {DEFAULT_SOURCE}:
        named = {}
    missing = sorted(set(own) - set(named)) if named else []
    if missing:  # a shard the manifest could not say the source of: never sealed with a made-up index
        raise ValueError(f"epoch {epoch} names shards of source(s) {missing} it has no entry for (its sources: "
                         f"{sorted(named)})")
    index = np.array([sorted(named).index(n) if n in named else 0 for n in shards.sources] or [0], np.int64)
    table = np.stack([shards.id, shards.rows, shards.bytes, shards.rows_per_block], axis=1)
    new = ~np.isin(shards.id, previous, assume_unique=True)
    return Manifest(
        sources=named, shard_sources=pack_indices(index[shards.source]) if named else "",
        epoch=epoch, seed=seed, source=source, lmdb_path=lmdb_path, map_size=map_size, schema=schema,
        cache_id=cache_id,
        skipped_columns=dict(skipped_columns or {}), sealed_at=time.time(),
        samples=int(shards.rows.sum()), bytes=int(shards.bytes.sum()),
        new_samples=int(shards.rows[new].sum()), remote_bytes=remote_bytes, shards=table,
    )


@dataclass
class EpochRules:
    """What decides which shards an epoch names and how long manifests are kept (``--epoch-*`` settings)."""

    wait_max: float = 30.0  # the longest wait for min_samples
    max_samples: int = 0  # cap on an epoch's samples (0: none); PATCH /v1/config changes it
    keep_last: int = 0  # manifests kept besides pinned and job-mapped ones (0: all)
    headroom: float = 0.2  # share of the budget a new epoch leaves to the policy's next evictions
    seed: int = 0  # of a capped epoch's subset, and of random eviction


class EpochManager:
    def __init__(self, catalog: Catalog, writer: Writer, leases: LeaseTable, jobs: JobTable, budget: Budget,
                 manifest_fields: Callable[[], dict[str, Any]], rules: EpochRules,
                 on_new_epoch: Callable[[int], None] = lambda epoch: None,
                 not_ready: Callable[[], str | None] = lambda: None,
                 shares: Callable[[], dict[str, float]] = lambda: {DEFAULT_SOURCE: 1.0},
                 outside: Callable[[], dict[str, frozenset[str]]] = dict) -> None:
        """``manifest_fields``: what every manifest says besides its shards (called once per seal);
        ``on_new_epoch``: a new epoch was granted its share of replacement (see ``grant``); ``not_ready``: why no
        epoch can be sealed yet (no source discovered), or None; ``shares``: the sources a new epoch names, each
        with its fraction of the budget (a removed source, or one not listed yet, is not named); ``outside``: each
        source's files that its filter leaves out (its shards of them are not named)."""
        self.catalog, self.writer, self.leases, self.jobs, self.budget = catalog, writer, leases, jobs, budget
        self.manifest_fields = manifest_fields
        self.rules = rules
        self.on_new_epoch = on_new_epoch
        self.not_ready = not_ready
        self.shares = shares
        self.outside = outside
        self._unread: dict[int, float] = {}  # epochs that were granted a share and have no lease yet -> when
        self._unread_lock = threading.Lock()  # leases are settled on the writer thread
        self._fresh: dict[int, float] = {}  # epochs sealed and not leased yet -> when (their own short pin)
        self._lock = asyncio.Lock()
        self._ids: dict[int, frozenset[int]] = {}  # epoch -> the ids of its shards (pins), made when asked
        self._id_arrays: dict[int, np.ndarray] = {}  # epoch -> the same ids as an array (a seal's "previous")
        self._sealed_from: dict[int, tuple[Any, ...]] = {}  # the latest uncapped epoch -> what it was made from

    def kept_epochs(self) -> set[int]:
        """Epochs whose manifests must stay whatever their age: pinned (leases, a fresh seal) or job-mapped."""
        return self.pinned_epochs() | self.jobs.mapped()

    def resident_for_epoch(self) -> Columns:
        """What a new epoch may name: the resident shards, less what the eviction policy would drop to keep
        ``headroom`` of the budget free. While an epoch is leased its shards cannot be evicted, so this headroom
        is where new shards go until the next epoch; without it a full, leased cache could never take in new
        data. Shards of a file no longer live in its table, or outside their source's filter, are never named, even
        while a lease keeps them.
        Columns in, columns out: no loop over the shards (100k of them seal in milliseconds)."""
        cols = self.catalog.columns()
        removed = self.catalog.removed_files()
        gone = cols.in_files(removed) if removed else np.zeros(len(cols), bool)
        for name, paths in self.outside().items():
            if paths:
                gone |= cols.of_source(name) & cols.in_files(paths)
        if gone.any():
            cols = cols.take(~gone)
        keep = np.zeros(len(cols), bool)
        for name, fraction in self.shares().items():  # each source's headroom within its own share
            mine = np.flatnonzero(cols.of_source(name))
            if not len(mine):
                continue
            room = int(self.budget.max_bytes * fraction * (1.0 - self.rules.headroom))
            sizes = cols.bytes[mine]
            drop, _ = evict_first(cols.id[mine], sizes, cols.last_used[mine], int(sizes.sum()) - room,
                                  self.budget.policy, self.rules.seed)
            kept = np.ones(len(mine), bool)
            kept[drop] = False
            keep[mine[kept] if kept.any() else mine[-1:]] = True
        return cols.take(keep)

    def last_sealed(self) -> int:
        eps = self.catalog.epochs()
        return eps[-1] if eps else -1

    def shard_ids(self, epoch: int) -> frozenset[int]:
        got = self._ids.get(epoch)
        if got is None:
            ids = self.named_ids(epoch)
            if not len(ids):
                return frozenset()  # not sealed, or no longer kept: never cached as "no shards"
            got = self._ids[epoch] = frozenset(ids.tolist())
        return got

    def _forget_dropped(self) -> None:
        """Drop the cached ids of epochs no longer kept (their manifests were pruned)."""
        kept = set(self.catalog.epochs())
        for cache in (self._ids, self._id_arrays):  # the writer's thread and the event loop's may both be here
            for e in [e for e in list(cache) if e not in kept]:
                cache.pop(e, None)

    def named_ids(self, epoch: int) -> np.ndarray:
        """The ids of the shards ``epoch`` names, ascending (empty when it is not sealed or no longer kept). A
        manifest parsed here drops the cached ids of epochs no longer kept."""
        got = self._id_arrays.get(epoch)
        if got is None:
            raw = self.catalog.manifest_bytes(epoch)
            if not raw:
                return np.zeros(0, np.int64)
            got = self._id_arrays[epoch] = Manifest.from_json(json.loads(raw)).table()[:, 0].copy()
            self._forget_dropped()
        return got

    def pinned_epochs(self) -> set[int]:
        sealed = set(self.catalog.epochs())
        pinned = {e for e in self.leases.epochs() | self.jobs.recently_mapped() if e in sealed}
        grace = min(self.leases.default_ttl, PIN_GRACE_S)
        now = time.monotonic()
        with self._unread_lock:
            pinned |= {e for e, t in self._fresh.items() if now - t < grace and e in sealed}
        return pinned

    def pinned_shards(self) -> set[int]:
        out: set[int] = set()
        for e in self.pinned_epochs():
            out |= self.shard_ids(e)
        return out

    async def _warm(self, epoch: int, min_samples: int, timeout: float) -> None:
        """Wait (bounded) until the cache holds ``min_samples``; 503 with Retry-After when it does not."""
        deadline = time.monotonic() + min(max(timeout, 0.0), self.rules.wait_max)
        while self.catalog.resident_rows < min_samples:
            if time.monotonic() >= deadline:
                raise NotReady(f"epoch {epoch} needs at least {min_samples} samples; the cache holds "
                                      f"{self.catalog.resident_rows} so far (warming up): retry later",
                                 retry_after=2.0)
            await asyncio.sleep(0.05)

    def _check_ready(self) -> None:
        why = self.not_ready()
        if why is not None:
            raise NotReady(why, retry_after=2.0)

    def summary(self, epoch: int) -> dict[str, Any]:
        """What ``epoch``'s manifest holds in numbers (samples, bytes, ...); empty once it is no longer kept."""
        return self.catalog.summary(epoch)

    def summaries(self) -> dict[int, dict[str, Any]]:
        return self.catalog.summaries()

    def sealed(self) -> list[int]:
        """The epochs whose manifests are kept, oldest first."""
        return self.catalog.epochs()

    def compact_manifest(self, epoch: int) -> bytes | None:
        """``epoch``'s manifest with its shard table packed (what the client reads), if it is sealed."""
        return self.catalog.compact_manifest(epoch)

    def full_manifest(self, epoch: int) -> bytes | None:
        """``epoch``'s manifest with its shard table as the list of rows (the plain JSON form), if it is sealed."""
        return self.catalog.full_manifest(epoch)

    def _made_from(self) -> tuple[Any, ...]:
        """What an uncapped epoch sealed now would be made from: the resident shards and the settings that
        decide which of them it names (and the files: one that left its table takes its shards out)."""
        return (self.catalog.shards_version, self.catalog.files_version, self.budget.max_bytes, self.budget.policy)

    def grant(self, epoch: int) -> bool:
        """Grant new ``epoch`` its share of replacement, unless UNREAD_GRANTS epochs granted within the lease TTL
        still have no reader. Only a job's epoch or an authorized request asks (the routes decide)."""
        now = time.time()
        with self._unread_lock:
            self._unread = {e: t for e, t in self._unread.items() if now - t < self.leases.default_ttl}
            unread = sorted(self._unread)
            granted = epoch not in self._unread and len(unread) < UNREAD_GRANTS
            if granted:
                self._unread[epoch] = now
        if not granted:
            if epoch not in unread:  # else another job reuses it before its lease: no news
                log.info("epoch %d grants no replacement: epochs %s were granted one and nobody leased them",
                         epoch, unread, extra={"event": "grant_withheld", "epoch": epoch})
            return False
        self.on_new_epoch(epoch)
        return True

    def hold(self, epoch: int) -> None:
        """Pin ``epoch`` until its next lease, for PIN_GRACE_S at most (a lease taken ahead was handed back)."""
        self._mark_fresh(epoch)

    def _mark_fresh(self, epoch: int) -> None:
        """``epoch`` is pinned until its first lease, for PIN_GRACE_S at most (pinned_epochs). Only the newest such
        epoch: an older one a job mapped is pinned by the mapping (jobs.recently_mapped), and a run of epochs sealed
        with no reader must not all be kept past --epochs-kept."""
        with self._unread_lock:
            self._fresh = {epoch: time.monotonic()}

    def read_started(self, epoch: int) -> None:
        """A reader leased ``epoch``: its grant is spent on a reader, and its lease pins it from now on."""
        with self._unread_lock:
            self._unread.pop(epoch, None)
            self._fresh.pop(epoch, None)

    async def _seal(self, epoch: int, cap: int, grant: bool) -> bytes:
        """Seal ``epoch`` (the next one) from the shards resident now. The caller holds ``_lock``."""
        previous = self.named_ids(epoch - 1) if epoch > 0 else np.zeros(0, np.int64)
        fields = self.manifest_fields()
        key = self._made_from()
        made: list[Manifest] = []  # the manifest, once built (not when it was there already)

        def build() -> Manifest:
            # on the writer thread, before the seal commits: no ingest after it can evict the epoch's shards
            self._mark_fresh(epoch)
            resident = self.resident_for_epoch()
            if fields.get("sources"):
                # the sources ready when the fields were made: one ready since (its first listing ended while
                # this seal queued behind ingests) is named from the next seal on, with its entry
                keep = np.zeros(len(resident), bool)
                for name in fields["sources"]:
                    keep |= resident.of_source(name)
                if not keep.all():
                    resident = resident.take(np.flatnonzero(keep))
            shards = resident.take(select_shards(resident.rows, cap, fields["seed"], epoch))
            made.append(build_manifest(epoch, shards, previous=previous, **fields))
            return made[0]

        raw = await asyncio.wrap_future(self.writer.seal(epoch, build, self.rules.keep_last, self.kept_epochs))
        if made:
            self._id_arrays[epoch] = made[0].table()[:, 0]  # the next seal's "previous": never parsed back
            self._forget_dropped()
            log.info("epoch %d sealed: %d shards, %d samples", epoch, len(made[0].table()), made[0].samples,
                     extra={"event": "epoch_sealed", "epoch": epoch, "rows": made[0].samples})
        self._sealed_from = {epoch: key} if cap <= 0 else {}
        if grant:
            self.grant(epoch)
        return raw

    async def manifest(self, epoch: int, min_samples: int = 1, timeout: float = 30.0,
                       max_samples: int | None = None, grant: bool = False) -> bytes:
        """The sealed manifest of ``epoch``; seals it now if it is the next one (``grant``: with a share of
        replacement, for an authorized request)."""
        raw = self.catalog.manifest_bytes(epoch)
        if raw is not None:
            return raw
        self._check_ready()
        last = self.last_sealed()
        if epoch > last + 1:
            raise Conflict(f"epoch {epoch} cannot be sealed yet: the last sealed epoch is {last}, "
                                  f"so the next one is {last + 1}")
        if epoch <= last:
            raise Gone(f"epoch {epoch} is no longer kept: the daemon keeps the last {self.rules.keep_last} "
                                  f"sealed epochs and those leased or mapped by a job (kept now: from "
                                  f"{self.catalog.epochs()[0]} to {last}); start from a newer epoch")
        await self._warm(epoch, min_samples, timeout)
        async with self._lock:
            raw = self.catalog.manifest_bytes(epoch)
            if raw is not None:
                return raw
            if self.last_sealed() != epoch - 1:
                raise Conflict(f"epoch {epoch} cannot be sealed: the last sealed epoch is {self.last_sealed()}")
            return await self._seal(epoch, self.rules.max_samples if max_samples is None else max_samples, grant)

    async def seal_new(self, min_samples: int = 1, timeout: float = 30.0, max_samples: int | None = None) -> int:
        """A new epoch of the shards resident now, with this request's own cap and warm-up (for a job's new
        epoch; never one sealed meanwhile for another request). The latest epoch is reused when sealing now
        would give the same manifest: no shard came or went since, no cap, the same budget and policy, and
        enough samples. Returns its number."""
        cap = self.rules.max_samples if max_samples is None else max_samples
        self._check_ready()
        await self._warm(self.last_sealed() + 1, min_samples, timeout)
        async with self._lock:
            last = self.last_sealed()
            summary = self.catalog.summary(last)
            if cap <= 0 and self._sealed_from.get(last) == self._made_from() \
                    and int(summary.get("samples", 0)) >= max(1, min_samples):
                self._mark_fresh(last)  # pinned from now until its lease, as a new seal is
                # an eviction the writer had under way is committed and in the catalog after this no-op
                await asyncio.wrap_future(self.writer.submit(lambda txn: None))
                if self._sealed_from.get(last) == self._made_from():  # and nothing went meanwhile
                    self.grant(last)  # a new job epoch starts on it: one more share of replacement
                    return last
            await self._seal(last + 1, cap, grant=True)
            return last + 1
