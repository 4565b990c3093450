"""The daemon: wires discovery, the planner, the sampler pool, the writer, epochs and leases."""

from __future__ import annotations

import collections
import errno
import logging
import os
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import lmdb

from samplecache.service.cachedir import StartupError, check_identity, lock_cache_dir, map_size_for
from samplecache.service.catalog import Catalog, Shard
from samplecache.service.discovery import Discovery, quarantined
from samplecache.service.epochs import EpochManager
from samplecache.service.eviction import EvictionPlan, plan_eviction
from samplecache.service.jobs import JobTable
from samplecache.service.leases import Lease, LeaseTable
from samplecache.service.pacing import Pacer
from samplecache.service.traffic import Traffic
from samplecache.service.planner import Pick, Planner, build_units
from samplecache.service.remote import FsspecRemote, RemoteError
from samplecache.service.sampler import SampleResult, SampleTask
from samplecache.service.settings import Settings
from samplecache.service.staging import leftovers
from samplecache.service.supervisor import Supervisor
from samplecache.service.writer import NoRoom, Writer, open_env

log = logging.getLogger("samplecache.daemon")

MAX_ATTEMPTS = 3


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started = time.time()
        try:
            settings.cache_dir.mkdir(parents=True, exist_ok=True)
            settings.staging_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StartupError(f"cache_dir {settings.cache_dir}: {e}") from e
        self._lock_fd = lock_cache_dir(settings.cache_dir)
        self.max_bytes = int(settings.max_bytes)
        self.min_free_disk = int(settings.min_free_disk)
        self.policy = settings.eviction_policy
        self.map_size = map_size_for(self.max_bytes)
        self.env, self.dbs = open_env(settings.lmdb_path, self.map_size)
        self.catalog = Catalog(self.env, self.dbs)
        self.writer = Writer(self.env, self.dbs, self.catalog)
        check_identity(self.catalog, self.writer, settings)
        self.leases = LeaseTable(settings.lease_ttl)
        self.leases.load(self.catalog.meta("leases", []) or [])
        self.jobs = JobTable(settings.lease_ttl)
        self.jobs.load(self.catalog.meta("jobs", []) or [])
        self._ingesting = 0  # bytes of shards sampled and on their way to the writer
        self.epochs = EpochManager(self.catalog, self.writer, self.leases, self._manifest_fields,
                                   settings.epoch_wait_max)
        self.epochs.max_samples = settings.epoch_max_samples
        self.epochs.resident_for_epoch = self.epoch_shards
        self.epochs.extra_pins = self.jobs.recently_mapped
        self.epochs.reuse_key = lambda: (self.max_bytes, self.policy)
        self.remote = FsspecRemote(settings.source, settings.storage_options) if settings.source else None
        self.traffic = Traffic(Pacer(settings.pacing, settings.replace_per_epoch, int(settings.max_ingest_rate)),
                               lambda: self.remote.bytes_read if self.remote is not None else 0)
        self.epochs.on_new_epoch = lambda epoch: self.traffic.epoch_started(self.max_bytes)
        self.discovery = Discovery(self.remote, self.catalog, self.writer, settings.columns) if self.remote else None
        self.planner: Planner | None = None
        self.supervisor = Supervisor(settings.samplers, self._on_result)
        self.paused_reason: str | None = None
        self.user_paused = False
        self.complete = False  # every remote unit is resident: nothing new to sample
        self.disk_full: str | None = None
        self.last_error: str | None = None
        self.remote_errors = 0
        self.evicted_shards = 0
        self._skips = 0
        self._quarantined_units = 0  # this node's units in quarantined files
        self._files_seen = -1
        self._attempts: dict[str, int] = collections.defaultdict(int)
        self._backoff_until = 0.0
        self._held_retry_at = 0.0
        self._retrying = 0  # held results re-submitted and not answered yet
        self._count_lock = threading.Lock()
        self._next_discovery = 0.0
        self._held: collections.deque[SampleResult] = collections.deque()  # staged, waiting for room
        self._ingests: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=4096)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def schema(self) -> Any:
        return self.discovery.schema if self.discovery else None

    # -- start / stop ------------------------------------------------------------------------
    def check_remote(self) -> None:
        """Fail fast at start when a fresh cache's source is unusable (raises StartupError)."""
        if self.remote is None:
            raise StartupError("source is not set: pass --source URL or SAMPLECACHE_SOURCE")
        if not self.catalog.files():
            self._discover()
            if self.planner is None:
                raise StartupError(self.last_error or f"cannot read source {self.settings.source!r}")
        largest = self.largest_unit_bytes()
        if largest > self.max_bytes:
            raise StartupError(f"max_bytes {self.max_bytes} is smaller than one row group of the source "
                               f"(about {largest} bytes uncompressed): --max-bytes / SAMPLECACHE_MAX_BYTES of at "
                               f"least {largest} fits")

    def start(self) -> None:
        self._recover_staging()
        self.supervisor.start()
        t = threading.Thread(target=self._run, name="samplecache-scheduler", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        """Stop sampling, finish queued ingests, close LMDB. Safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self.supervisor.stop(timeout=3)  # staged-but-not-ingested files stay for the next start
        self.writer.close()
        self.env.close()
        os.close(self._lock_fd)

    def _recover_staging(self) -> None:
        n = 0
        for path in leftovers(self.settings.staging_dir):
            try:
                self.writer.ingest(path, make_room=self.make_room).result()
                n += 1
            except NoRoom:
                path.unlink(missing_ok=True)  # its unit is not marked done: it will be sampled again
        if n:
            log.info("recovered %d staging file(s) from the previous run", n)

    # -- budget ------------------------------------------------------------------------------
    def make_room(self, incoming: int) -> EvictionPlan:
        """Which shards to evict so ``incoming`` more bytes fit (runs on the writer thread)."""
        return plan_eviction(self.catalog.shards(), self.epochs.pinned_shards(), self.max_bytes, incoming,
                             self.policy, self.settings.seed)

    def epoch_shards(self) -> list[Shard]:
        """What a new epoch may name: the resident shards, less what the eviction policy would drop to
        keep ``epoch_headroom`` of the budget free. While an epoch is leased its shards cannot be
        evicted, so this headroom is where new shards go until the next epoch; without it a full,
        leased cache could never take in new data."""
        shards = self.catalog.shards()
        keep = int(self.max_bytes * (1.0 - self.settings.epoch_headroom))
        drop = set(plan_eviction(shards, (), keep, 0, self.policy, self.settings.seed).evict)
        return [s for s in shards if s.id not in drop] or shards[-1:]

    def count_evicted(self, fut: Any) -> None:
        if fut.exception() is None:
            ids = fut.result()
            self.evicted_shards += len(ids)

    def largest_unit_bytes(self) -> int:
        """The footer's estimate of the largest row group (uncompressed), for budget checks at start."""
        return max((b for i in self.catalog.files().values() if not i.get("quarantined")
                    for b in i.get("row_group_bytes", [])), default=0)

    # -- the scheduling loop -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() >= self._next_discovery:
                self._discover()
            if self.planner is not None:
                self._expire_leases()
                self._retry_held()
                self._fill()
            self._stop.wait(0.05)

    def _discover(self) -> None:
        assert self.discovery is not None
        try:
            new = self.discovery.run()
            self.last_error = None if self.planner is not None or self.schema else self.last_error
            files = self.catalog.files()
            if self.planner is None:
                units = build_units(files)
                self.planner = Planner(units, seed=self.settings.seed, node_rank=self.settings.node_rank,
                                       num_nodes=self.settings.num_nodes, cursor=self.catalog.meta("cursor"))
                log.info("source %s: %d files, %d row groups (%d on this node)", self.settings.source,
                         len(files), len(units), len(self.planner))
                self.last_error = None
            elif new:
                added = [u for u in build_units({p: files[p] for p in new})]
                self.planner.add_units(added)
                self.complete = False
            self._next_discovery = time.monotonic() + self.settings.discover_interval
        except Exception as e:  # remote down or bad: report, retry
            self.last_error = str(e) if isinstance(e, RemoteError) else f"{type(e).__name__}: {e}"
            self.remote_errors += 1
            log.warning("remote: %s (retrying in %.0fs)", self.last_error, self.settings.retry_seconds)
            self._next_discovery = time.monotonic() + self.settings.retry_seconds

    def _expire_leases(self) -> None:
        gone = self.leases.expire()
        for lease in gone:
            self.lease_ended(lease)
        if self.jobs.expire(self.leases.jobs()) or gone:
            self.persist_leases()

    def lease_ended(self, lease: Lease) -> None:
        """A lease was released or expired: its reader's samples count for its job's epoch."""
        self.jobs.add_read(lease.job, lease.job_epoch, lease.read)

    def _why_not_sample(self) -> str | None:
        assert self.planner is not None
        if self.complete and self.catalog.resident_units() + self._quarantined_units < len(self.planner):
            self.complete, self._skips = False, 0
        if self.user_paused:
            return "paused by request"
        if self.disk_full:
            free = shutil.disk_usage(self.settings.cache_dir).free
            if free < self.min_free_disk or time.monotonic() < self._backoff_until:
                return self.disk_full
            self.disk_full = None
        if self._held or self._retrying:
            pinned = sorted(self.epochs.pinned_epochs())
            return (f"budget full: every evictable shard is pinned by leases on epochs {pinned}; "
                    f"{len(self._held) + self._retrying} shard(s) wait for a lease to end")
        if self.complete:
            return "the whole remote dataset is cached"
        if time.monotonic() < self._backoff_until:
            return "remote unreachable: backing off"
        free = shutil.disk_usage(self.settings.cache_dir).free
        if free < self.min_free_disk:
            return f"disk almost full: {free} bytes free < min_free_disk {self.min_free_disk}"
        return None

    def _fill(self) -> None:
        assert self.planner is not None and self.schema is not None
        if self._files_seen != self.catalog.files_version:
            self._files_seen = self.catalog.files_version
            self._quarantined_units = sum(1 for u in self.planner.units if self.catalog.file(u.path).get("quarantined"))
        self.paused_reason = self._why_not_sample()
        if self.paused_reason is not None:
            return
        while self.supervisor.pending() < 2 * self.supervisor.size:
            pick = self.planner.next()
            if pick is None:
                return
            settled = self.catalog.unit_resident(pick.unit.path, pick.unit.row_group) or \
                self.catalog.file(pick.unit.path).get("quarantined")
            if settled:
                # still cached from an earlier pass (sampling it again would only duplicate samples),
                # or its file is quarantined
                self.planner.done(pick.cycle, pick.position)
                self._skips += 1
                if self._skips >= len(self.planner):
                    self.complete = True
                    return
                continue
            self._skips = 0
            if not self._paced_submit(pick):
                self.planner.retry(pick)  # handed out again when the pace allows
                return

    def _paced_submit(self, pick: Pick) -> bool:
        """Send ``pick`` to a sampler if the pace allows it (else say why in ``paused_reason``)."""
        assert self.planner is not None and self.schema is not None
        sizes = self.catalog.file(pick.unit.path).get("row_group_bytes") or []
        size = int(sizes[pick.unit.row_group]) if pick.unit.row_group < len(sizes) else 0
        committed = self.catalog.resident_bytes + self._ingesting + self.traffic.out_bytes() + \
            sum(r.bytes for r in list(self._held))
        key = f"c{pick.cycle}-u{pick.position}"
        self.paused_reason = self.traffic.admit(key, size, committed, self.max_bytes)
        if self.paused_reason is not None:
            return False
        self.supervisor.submit(SampleTask(
                key=key, source=self.settings.source,
                storage_options=dict(self.settings.storage_options), path=pick.unit.path,
                row_group=pick.unit.row_group, schema=self.schema.to_json(),
                staging_dir=str(self.settings.staging_dir), block_bytes=int(self.settings.block_bytes),
                unit=pick.position, cycle=pick.cycle))
        return True

    def _finish(self, pick: Pick) -> None:
        """Mark a unit done without a shard (its file is quarantined)."""
        assert self.planner is not None
        cursor = self.planner.cursor_after(pick.cycle, pick.position)
        self.planner.done(pick.cycle, pick.position)
        self.writer.put_meta({"cursor": cursor})

    # -- results -----------------------------------------------------------------------------------
    def _on_result(self, r: SampleResult) -> None:
        self.traffic.returned(r)
        if r.ok and r.staged:
            self._ingest(r)
            return
        t = r.task
        pick = Pick(t.cycle, t.unit, None)  # type: ignore[arg-type]
        self.remote_errors += 1
        self.last_error = f"{t.path} row group {t.row_group}: {r.error}"
        log.warning("sampling failed (%s): %s", r.error_kind, self.last_error)
        assert self.planner is not None
        if r.error_kind == "unreachable":
            self._backoff_until = time.monotonic() + self.settings.retry_seconds
            self.planner.retry(pick)
            return
        self._attempts[t.path] += 1
        if r.error_kind == "corrupt" or self._attempts[t.path] >= MAX_ATTEMPTS:
            self.quarantine(t.path, r.error or "unreadable")
            self._finish(pick)
        else:
            self.planner.retry(pick)

    def _ingest(self, r: SampleResult, retry: bool = False) -> None:
        assert self.planner is not None and r.staged is not None
        with self._count_lock:
            self._ingesting += r.bytes
        fut = self.writer.ingest(Path(r.staged), cursor=self.planner.cursor_after, make_room=self.make_room)
        fut.add_done_callback(lambda f: self._ingested(f, r, retry))

    def _retry_held(self) -> None:
        if not self._held or time.monotonic() < self._held_retry_at:
            return
        self._held_retry_at = time.monotonic() + 0.5
        for _ in range(len(self._held)):
            with self._count_lock:
                self._retrying += 1
            self._ingest(self._held.popleft(), retry=True)

    def _ingested(self, fut: Any, r: SampleResult, retry: bool = False) -> None:
        assert self.planner is not None
        exc = fut.exception()
        with self._count_lock:
            self._ingesting -= r.bytes
            if retry:
                self._retrying -= 1
        if isinstance(exc, NoRoom):
            self._held.append(r)  # backpressure: wait for a lease to end; the budget is never exceeded
            return
        if isinstance(exc, (lmdb.MapFullError, lmdb.DiskError)) or (
                isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
            self.disk_full = f"disk full while ingesting: {type(exc).__name__}: {exc}"
            self._backoff_until = time.monotonic() + self.settings.retry_seconds
            self.last_error = self.disk_full
            log.error("%s; sampling pauses and the shard waits", self.disk_full)
            self._held.append(r)
            return
        if exc is not None:
            self.last_error = f"ingest failed: {type(exc).__name__}: {exc}"
            log.error("%s", self.last_error)
            self.planner.retry(Pick(r.task.cycle, r.task.unit, None))  # type: ignore[arg-type]
            return
        self.planner.done(r.task.cycle, r.task.unit)
        done = fut.result()
        self.evicted_shards += len(done.evicted)
        if done.shard is not None:
            self._ingests.append((time.time(), done.shard.rows, done.shard.bytes))

    def quarantine(self, path: str, reason: str) -> None:
        self.writer.put_files({path: quarantined(reason, self.catalog.file(path))})
        log.warning("quarantined %s: %s", path, reason)

    # -- leases ----------------------------------------------------------------------------------------
    def missing_shards(self, epoch: int) -> int:
        """How many shards of ``epoch`` are no longer resident."""
        return sum(1 for sid in self.epochs.shard_ids(epoch) if self.catalog.shard(sid) is None)

    def persist_leases(self) -> "Future[None]":
        """Queue the lease and job tables for the disk (a restart gives every saved lease a fresh TTL). They are
        read on the writer thread, so a later snapshot never lands before an earlier one."""
        return self.writer.put_meta(lambda: {"leases": self.leases.saved(), "jobs": self.jobs.saved()})

    # -- reporting -----------------------------------------------------------------------------------
    def _manifest_fields(self) -> dict[str, Any]:
        """What every manifest says besides its shards (called once per seal, just before it)."""
        assert self.schema is not None
        return {"schema": self.schema.to_json(), "lmdb_path": str(self.settings.lmdb_path),
                "map_size": self.map_size, "seed": self.settings.seed, "source": self.settings.source,
                "remote_bytes": self.traffic.sealing()}
