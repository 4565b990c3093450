"""The daemon: builds the parts (discovery, planner, samplers, writer, epochs, leases) and is the facade the HTTP
routes call. Sampling state belongs to the scheduler (``scheduler.py``); routes never write daemon fields."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

from samplecache_service.config.redact import redact, shown_id
from samplecache_service.config.settings import DEFAULT_SOURCE, MIN_BUDGET, Settings
from samplecache_service.epochs.jobs import JobTable
from samplecache_service.epochs.leases import LeaseTable
from samplecache_service.epochs.leasing import Leasing
from samplecache_service.epochs.manager import EpochManager, EpochRules
from samplecache_service.errors import Conflict, NotFound
from samplecache_service.files import make_dir
from samplecache_service.ops.control import configure
from samplecache_service.ops.health import Health
from samplecache_service.ops.history import History, Recorder
from samplecache_service.remote.discovery import Discovery, owner_of
from samplecache_service.remote.filters import FilterError
from samplecache_service.remote.planner import Planner
from samplecache_service.remote.schemas import SchemaConflict
from samplecache_service.remote.stores import FsspecRemote
from samplecache_service.sampling.pacing import Pacer
from samplecache_service.sampling.sampler import SampleResult
from samplecache_service.sampling.scheduler import Scheduler
from samplecache_service.sampling.sources import Source, changed_remotes
from samplecache_service.sampling.supervisor import Supervisor
from samplecache_service.sampling.traffic import Traffic
from samplecache_service.store.budget import Budget, ShareOf
from samplecache_service.store.cachedir import (
    StartupError,
    check_identity,
    check_lmdb_file,
    check_sources,
    lock_cache_dir,
    map_size_for,
    reset_cache,
)
from samplecache_service.store.cacheguard import INTERVAL_S, CacheGuard
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.disk import DiskSpace
from samplecache_service.store.envgate import EnvGate
from samplecache_service.store.eviction import EvictionPlan, plan_by_source
from samplecache_service.store.fileinfo import FileInfo
from samplecache_service.store.lmdbmap import open_cache_env
from samplecache_service.store.staging import leftovers, set_aside
from samplecache_service.store.writer import NoRoom, Writer

log = logging.getLogger("samplecache.daemon")


def _exit_on_fatal(reason: str) -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down; `samplecache serve` then exits 1


def listed(path: str, info: FileInfo) -> dict[str, Any]:
    """A quarantined file as GET /v1/quarantine lists it: credentials masked, with the id that names it."""
    return {"id": shown_id(path), "path": redact(path), "reason": redact(info.reason), "kind": info.kind,
            "at": info.at, "released": info.recheck}


class Daemon:
    def __init__(self, settings: Settings, reset: bool = False) -> None:
        """``reset``: drop the cache dir's LMDB cache and staging files first (``serve --reset-cache``)."""
        self.settings = settings
        self.started = time.time()
        self.named = settings.named_sources()  # name -> (URL, fraction of the budget)
        self.filters = settings.source_filters()  # name -> its partition filter (None: none)
        first = next(iter(self.named.values()), ("", 1.0))[0]
        self.source_shown = redact(settings.source or first)
        try:
            make_dir(settings.cache_dir)
            make_dir(settings.staging_dir)
        except OSError as e:
            raise StartupError(f"cache_dir {settings.cache_dir}: {e}") from e
        self._lock_fd = lock_cache_dir(settings.cache_dir)
        try:
            if reset:
                reset_cache(settings)
                log.warning("--reset-cache: the LMDB cache and staging files of %s were dropped", settings.cache_dir,
                            extra={"event": "cache_reset", "path": str(settings.cache_dir)})
            check_lmdb_file(settings.lmdb_path)  # a damaged file: one line and exit 2, never SIGBUS
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.health = Health(on_fatal=_exit_on_fatal)
        # the config file and the last reload (service/samplecache_service/ops/reload.py)
        self.config_state: dict[str, Any] | None = None
        self.budget = Budget(int(settings.max_bytes), int(settings.min_free_disk), settings.eviction_policy)
        self.map_size = map_size_for(self.budget.max_bytes)
        try:  # a map this machine cannot hold: one line naming the largest budget that works (exit 2)
            self.env, self.dbs = open_cache_env(settings.lmdb_path, self.budget.max_bytes)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.gate = EnvGate(self.env)  # HTTP handlers' reads of the environment: a stop closes it after them
        self.catalog = Catalog(self.env, self.dbs, self.gate)
        self.writer = Writer(self.env, self.dbs, self.catalog)
        self.disk = DiskSpace(settings.cache_dir, self.gate, self.dbs)
        self.cache_id = check_identity(self.catalog, self.writer, settings)
        try:
            check_sources(self.catalog, self.writer, {n: url for n, (url, _) in self.named.items()})
        except StartupError:
            self._close()
            raise
        self.leases = LeaseTable(settings.lease_ttl, max_leases=settings.max_leases,
                                 max_per_job=settings.max_leases_per_job)
        self.jobs = JobTable(settings.lease_ttl)
        self.jobs.load(self.catalog.saved_jobs, changed=self.catalog.legacy_jobs)
        try:  # no source at all is check_remote's to say, after the cache is opened (a map too large says first)
            remotes = changed_remotes({}, self.named, self._remote, filters=self.filters) if self.named else {}
        except Conflict as e:
            self._close()
            raise StartupError(str(e)) from None
        self._gone_bytes = 0  # read by the remotes of sources removed since start
        self.traffic = Traffic(Pacer(settings.pacing, settings.replace_per_epoch, int(settings.max_ingest_rate)),
                               lambda: self._gone_bytes + sum(s.remote.bytes_read for s in list(self.sources.values())
                                                              if s.remote is not None))
        rules = EpochRules(wait_max=settings.epoch_wait_max, max_samples=settings.epoch_max_samples,
                           keep_last=settings.epochs_kept, headroom=settings.epoch_headroom, seed=settings.seed)
        self.epochs = EpochManager(self.catalog, self.writer, self.leases, self.jobs, self.budget,
                                   self._manifest_fields, rules,
                                   on_new_epoch=lambda epoch: self.traffic.epoch_started(
                                       {n: s.share.max_bytes for n, s in list(self.sources.items())}),
                                   not_ready=self._not_discovered, shares=self.epoch_shares,
                                   outside=self.outside_files)
        self.leasing = Leasing(self.catalog, self.epochs, self.leases, self.jobs, self.writer)
        # the samplers' results go to their source's scheduler, built next (the supervisor starts in start())
        self.supervisor = Supervisor(settings.samplers, self._on_result)
        self.sources: dict[str, Source] = {}  # replaced whole when sources change (readers see one or the other)
        several = len(self.named) > 1 or DEFAULT_SOURCE not in self.named
        for name, (url, fraction) in self.named.items():
            try:
                self.sources[name] = self._make_source(name, url, fraction, remotes[name], several,
                                                       self.filters.get(name, self.settings.filter))
            except (SchemaConflict, FilterError) as e:
                self._close()
                raise StartupError(f"source {name!r}: {e}" if several else str(e)) from None
        self._sources_lock = threading.Lock()
        # the first source answers where the daemon speaks of one (the default source, when there is one)
        first_source = next(iter(self.sources.values()), None)
        self.remote = first_source.remote if first_source else None
        self.discovery = first_source.discovery if first_source else None
        self.scheduler = first_source.scheduler if first_source else Scheduler(
            settings, self.catalog, self.writer, self.disk, self.traffic, self.supervisor, self.budget, None,
            pinned_epochs=self.epochs.pinned_epochs, make_room=self.make_room, expire_leases=self.leasing.expire,
            die=self.health.die)
        self.history = History()  # the status page's charts (GET /)
        self.recorder = Recorder(self.catalog, self.budget,
                                 lambda: {n: s.scheduler for n, s in self.sources.items()}, self.traffic, self.history)
        self.health.add_check("writer",
                              lambda: None if self.writer.alive() else "the LMDB writer thread is not running")
        self.health.add_check("samplers", self.supervisor.problem)
        # the cache dir as opened: removed or replaced under the daemon, it says so and exits (cacheguard.py)
        self.guard = CacheGuard(settings.cache_dir, settings.lmdb_path, self._lock_fd)
        self.health.add_check("cache dir", self.guard.problem)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- what the routes and the status read ----------------------------------------------------
    @property
    def schema(self) -> Any:
        return self.scheduler.schema()

    # the budget in force (PATCH /v1/config and SIGHUP change it through ``configure``)
    @property
    def max_bytes(self) -> int:
        return self.budget.max_bytes

    @property
    def min_free_disk(self) -> int:
        return self.budget.min_free_disk

    @property
    def policy(self) -> str:
        return self.budget.policy

    @property
    def planner(self) -> Planner | None:
        return self.scheduler.planner

    @property
    def paused_reason(self) -> str | None:
        # it may name the last error, and so a remote path with the source's credentials
        reason = self.scheduler.paused_reason
        return redact(reason) if reason else None

    @property
    def user_paused(self) -> bool:
        return self.scheduler.user_paused

    @property
    def last_error(self) -> str | None:
        return redact(self.scheduler.last_error) if self.scheduler.last_error else None

    @property
    def remote_errors(self) -> int:
        return sum(s.scheduler.remote_errors for s in list(self.sources.values()))

    @property
    def evicted_shards(self) -> int:
        return sum(s.scheduler.evicted_shards for s in list(self.sources.values()))

    def _make_source(self, name: str, url: str, fraction: float, remote: FsspecRemote, several: bool,
                     partition_filter: str | None) -> Source:
        """One named source's parts (raises SchemaConflict or FilterError from its discovery)."""
        s = self.settings
        owns = owner_of(remote) if several else None
        discovery = Discovery(remote, self.catalog, self.writer, s.columns, s.part_bytes, s.schema_file,
                              partition_filter, source=name, owns=owns)
        share = ShareOf(self.budget, fraction)
        shown = redact(url)
        scheduler = Scheduler(s, self.catalog, self.writer, self.disk, self.traffic, self.supervisor, share, discovery,
                              pinned_epochs=self.epochs.pinned_epochs, make_room=self.make_room,
                              expire_leases=self.leasing.expire, die=self.health.die, source_shown=shown, name=name,
                              url=remote.data_url, owns=owns, slots=self._slots)
        return Source(name, shown, share, remote, discovery, scheduler)

    def _start_source(self, source: Source) -> None:
        """Run ``source``'s scheduler on a thread of its own: a source whose remote hangs never holds up
        another's. It stops with the daemon, or when the source is removed."""
        label = "scheduler" if len(self.sources) == 1 and source.name == DEFAULT_SOURCE else f"scheduler {source.name}"
        self.health.thread(label).stopped = False
        t = threading.Thread(target=self.health.run_loop, args=(label, source.scheduler.step, source.stopping),
                             kwargs={"interval": 0.0}, name=f"samplecache-{label.replace(' ', '-')}", daemon=True)
        t.start()
        self._threads.append(t)

    def set_sources(self, named: dict[str, tuple[str, float]],
                    filters: dict[str, str | None] | None = None) -> dict[str, list[str]]:
        """Add, re-share and remove sources while running (SIGHUP, PATCH /v1/config): ``named`` is the whole set
        after the change, name -> (URL, fraction of the budget); ``filters``: each one's partition filter (a kept
        source's cannot change; unnamed: --filter's). A removed source stops sampling; its shards go once no lease
        pins them. Raises errors.Conflict (nothing changed) with what is wrong."""
        with self._sources_lock:
            old = dict(self.sources)
            given, default = filters or {}, self.settings.filter
            wanted = {n: (given[n] or default) if n in given else self.filters.get(n, default) if n in old else default
                      for n in named}
            moved = [n for n in named if n in old and wanted[n] != self.filters.get(n, default)]
            if moved:
                raise Conflict(f"source(s) {moved} would change filter: a source's filter is fixed while the daemon "
                               f"runs (its cached sample is of that filter); add the new filter under another name")
            remotes = changed_remotes(old, named, self._remote, say_url=False, filters=wanted)
            several = len(named) > 1 or DEFAULT_SOURCE not in named
            try:
                check_sources(self.catalog, self.writer, {n: u for n, (u, _) in named.items() if n not in old})
            except StartupError as e:
                raise Conflict(str(e)) from None
            added = {}
            for n, (url, fraction) in named.items():
                if n not in old:
                    try:
                        added[n] = self._make_source(n, url, fraction, remotes[n], several, wanted[n])
                    except (SchemaConflict, FilterError) as e:
                        raise Conflict(f"source {n!r}: {e}") from None
            reshared = [n for n in named if n in old and named[n][1] != old[n].share.fraction]
            for n, (_, fraction) in named.items():
                if n in old:
                    old[n].share.fraction = fraction
                    if several:  # a source alone owned every file; now only those under its root
                        old[n].scheduler.owns = owns = owner_of(old[n].remote)
                        found = old[n].discovery
                        if found is not None:
                            found.owns = owns
            self.sources = {n: old[n] if n in old else added[n] for n in named}
            self.filters = {**self.filters, **wanted}
            removed = [n for n in old if n not in named]
            for n in removed:
                old[n].stopping.set()
                self._gone_bytes += old[n].remote.bytes_read
            if self._threads:  # started: the new sources sample at once
                for source in added.values():
                    self._start_source(source)
            for source in self.sources.values():
                source.scheduler.complete = False
            first = next(iter(self.sources.values()))
            self.remote, self.discovery, self.scheduler = first.remote, first.discovery, first.scheduler
            self.writer.evict(self.make_room, "removed").add_done_callback(self.scheduler.count_evicted)
        log.info("sources changed: %s added, %s removed; shares now %s", sorted(added) or "none",
                 removed or "none", {n: round(s.share.fraction, 4) for n, s in self.sources.items()},
                 extra={"event": "sources_changed"})
        return {"added": sorted(added), "removed": removed, "reshared": reshared}

    def _remote(self, url: str) -> FsspecRemote:
        s = self.settings
        return FsspecRemote(url, s.storage_options, s.table_version, s.table_as_of, s.iceberg_catalogs)

    def _close(self) -> None:
        """Undo the opening of the cache (a start that fails after it)."""
        self.writer.close()
        self.env.close()
        os.close(self._lock_fd)

    def _on_result(self, result: SampleResult) -> None:
        """A sampler's result, to its source's scheduler (on the supervisor's thread)."""
        source = self.sources.get(result.task.name)
        if source is not None:
            source.scheduler.on_result(result)
            return
        # a source removed while its unit was out: nothing of it is ingested
        self.traffic.returned(result)
        for staged, _ in result.parts or ([(result.staged, result.bytes)] if result.staged else []):
            Path(staged).unlink(missing_ok=True)

    def _slots(self) -> int:
        """Units one source may have out at the samplers: an equal part of twice their number among the sources
        that sample now, so no source takes every sampler."""
        busy = sum(1 for s in self.sources.values() if s.scheduler.planner is not None and not s.scheduler.complete)
        return max(1, -(-2 * self.supervisor.size // max(1, busy)))

    def outside_files(self) -> dict[str, frozenset[str]]:
        """Each source's files that its filter leaves out (as its last listing found them; none: not listed)."""
        return {n: s.discovery.outside_files for n, s in list(self.sources.items())
                if s.discovery is not None and s.discovery.outside_files}

    def epoch_shares(self) -> dict[str, float]:
        """The sources a new epoch names, each with its fraction of the budget."""
        return {n: s.share.fraction for n, s in self.sources.items() if s.ready()}

    # -- start / stop ------------------------------------------------------------------------
    def check_remote(self) -> None:
        """Fail fast at start when a fresh cache's source is unusable (raises StartupError). With several
        sources, the start fails only when none can be read: the others are retried while they sample."""
        if not self.sources:
            raise StartupError("source is not set: pass --source URL (or --source NAME=URL, many times) or "
                               "SAMPLECACHE_SOURCE")
        if self.max_bytes < MIN_BUDGET:
            raise StartupError(f"max_bytes {self.max_bytes} is too small for one block of rows: --max-bytes / "
                               f"SAMPLECACHE_MAX_BYTES of at least {MIN_BUDGET} fits")
        failed: list[str] = []
        for source in self.sources.values():
            if source.discovery is not None and (not self.catalog.files() or source.scheduler.schema() is None):
                source.scheduler.discover(at_start=len(self.sources) == 1)
                if source.scheduler.planner is None:
                    failed.append(f"{source.name} ({source.shown}): {source.scheduler.last_error}")
        if len(failed) == len(self.sources):
            if len(self.sources) == 1:
                raise StartupError(self.last_error or f"cannot read source {self.source_shown!r}")
            raise StartupError("no source can be read: " + "; ".join(failed))
        for why in failed:
            log.warning("source %s cannot be read yet; retried while the others sample", why,
                        extra={"event": "source_failed"})

    def start(self) -> None:
        self._recover_staging()
        self.supervisor.start()
        for source in self.sources.values():
            self._start_source(source)
        if set(self.catalog.resident_sources()) - set(self.sources):  # a source removed: its shards may go
            self.writer.evict(self.make_room, "removed").add_done_callback(self.scheduler.count_evicted)
        t = threading.Thread(target=self.health.run_loop, name="samplecache-history", daemon=True,
                             args=("history", self.recorder.step, self._stop, self.history.interval))
        t.start()
        self._threads.append(t)
        t = threading.Thread(target=self.health.run_loop, name="samplecache-cacheguard", daemon=True,
                             args=("cache guard", lambda: self.guard.watch(self.health.die), self._stop, INTERVAL_S))
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        """Stop sampling, finish queued ingests, close LMDB. Safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        for source in self.sources.values():
            source.stopping.set()
        self.supervisor.stopping()  # from now on a sampler that dies is not replaced
        for t in self._threads:
            t.join(timeout=5)
        self.supervisor.stop(timeout=3)  # staged-but-not-ingested files stay for the next start
        still = [t.name for t in self._threads if t.is_alive()] + ([] if self.writer.close() else ["the writer"])
        if not self.gate.close(timeout=5, others_done=not still):
            # closing the environment under a thread inside it would crash the process: the exit frees it
            log.error("the LMDB environment is left open at stop: %s", ", ".join(still) or "an HTTP request is "
                      "still reading it", extra={"event": "stop_left_env_open"})
        self.guard.close()
        os.close(self._lock_fd)

    def _recover_staging(self) -> None:
        """Ingest what the previous run staged. A file that cannot be ingested (no room, a full disk, damage)
        is set aside or dropped with a log line: a restart never fails on a leftover."""
        n = 0
        for path in leftovers(self.settings.staging_dir):
            try:
                self.writer.ingest(path, make_room=self.make_room).result()
                n += 1
            except NoRoom:
                path.unlink(missing_ok=True)  # its unit is not marked done: it will be sampled again
            except Exception as e:  # disk full, I/O error, damage: keep the daemon starting
                where = set_aside(path)
                log.error("could not ingest the leftover staging file %s (%s: %s); %s; its unit will be sampled "
                          "again", path.name, type(e).__name__, e, f"moved to {where}" if where else "dropped",
                          extra={"event": "staging_recovery_failed", "path": str(path)})
        if n:
            log.info("recovered %d staging file(s) from the previous run", n, extra={"event": "staging_recovered"})

    # -- budget ------------------------------------------------------------------------------
    def make_room(self, incoming: int, source: str | None = None) -> EvictionPlan:
        """Which shards to evict so ``incoming`` more bytes of ``source`` fit within its share (runs on the writer
        thread; None: every source within its share, for nothing incoming): first every unpinned shard of a file
        no longer live in its table or outside its source's filter, then what the policy picks. A removed source's
        share is 0."""
        shards, pinned, removed = self.catalog.shards(), self.epochs.pinned_shards(), self.catalog.removed_files()
        outside = self.outside_files()
        stale = [s for s in shards if s.id not in pinned and (s.path in removed or s.path in outside.get(s.source, ()))
                 ] if removed or outside else []
        if stale:
            ids = {s.id for s in stale}
            shards = [s for s in shards if s.id not in ids]
        # the kept manifests count within the budget, each source's for its share
        plan = plan_by_source(shards, pinned, self.max_bytes - self.catalog.manifest_total,
                              {n: s.share.fraction for n, s in self.sources.items()}, incoming, source, self.policy,
                              self.settings.seed)
        if not stale:
            return plan
        return EvictionPlan(tuple(s.id for s in stale) + plan.evict, plan.freed + sum(s.bytes for s in stale),
                            plan.fits)

    # -- control: every change runs on the scheduler's thread ----------------------------------------
    def set_paused(self, paused: bool) -> "Future[None]":
        """Pause (or resume) every source's sampling; the future is done once each scheduler took it."""
        futures = [s.scheduler.call(partial(s.scheduler.set_paused, paused)) for s in self.sources.values()]
        done: Future[None] = Future()

        def settle(_: Any) -> None:
            if all(f.done() for f in futures) and not done.done():
                errors = [e for e in (f.exception() for f in futures) if e is not None]
                if errors:
                    done.set_exception(errors[0])
                else:
                    done.set_result(None)
        for f in futures:
            f.add_done_callback(settle)
        if not futures:
            done.set_result(None)
        return done

    def configure(self, **changes: Any) -> "Future[None]":
        """Change runtime settings (validated; the future raises errors.Invalid or errors.Conflict with what fits)."""
        def change() -> None:
            configure(self.budget, self.catalog, self.epochs, self.traffic.pacer, self.map_size, **changes)
            if changes.get("max_bytes") is not None or changes.get("policy") is not None:
                self.writer.evict(self.make_room).add_done_callback(self.scheduler.count_evicted)
                for source in self.sources.values():
                    source.scheduler.complete = False
            for source in self.sources.values():
                source.scheduler.call(source.scheduler.refresh_reason)
        return self.scheduler.call(change)

    def runtime_config(self) -> dict[str, Any]:
        """The settings that change at run time (PATCH /v1/config, SIGHUP), as in use now."""
        pacer = self.traffic.pacer
        return {"max_bytes": self.max_bytes, "eviction_policy": self.policy, "min_free_disk": self.min_free_disk,
                "epoch_max_samples": self.epochs.rules.max_samples, "pacing": pacer.mode,
                "replace_per_epoch": pacer.replace_per_epoch, "max_ingest_rate": pacer.max_rate,
                "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()}

    def quarantined(self) -> list[dict[str, Any]]:
        return [listed(p, i) for p, i in sorted(self.catalog.files().items()) if i.quarantined]

    def release(self, name: str) -> "Future[dict[str, Any]]":
        """Take the quarantined file ``name`` out of quarantine: it is read again at once (and quarantined again if
        still bad). ``name`` is its id or its path as GET /v1/quarantine lists them (credentials masked), or its
        real path. The future gives its entry as listed; it raises errors.NotFound when no quarantined file has
        that name."""
        def op() -> dict[str, Any]:
            files = self.catalog.files()
            # a listed (masked) path names one file: the paths of one source differ beyond its credentials
            found = {p: i.release() for p, i in files.items() if i.quarantined and name in (p, redact(p), shown_id(p))}
            if not found:
                raise NotFound(f"no quarantined file {redact(name)!r} (GET /v1/quarantine lists them)")
            self.writer.put_files(found).result()
            self.scheduler.discover_soon()
            return next(listed(p, i) for p, i in found.items())
        return self.scheduler.call(op)


    def _not_discovered(self) -> str | None:
        """Why no epoch can be sealed yet: no source can be served (``Source.not_ready``)."""
        why = {n: s.not_ready() for n, s in self.sources.items()}
        if len(why) == 1:
            return next(iter(why.values()))
        if not why or any(w is None for w in why.values()):
            return None if why else "no source"
        return "no source is ready: " + "; ".join(f"{n}: {w}" for n, w in why.items())

    # -- reporting -----------------------------------------------------------------------------------
    def _manifest_fields(self) -> dict[str, Any]:
        """What every manifest says besides its shards (called once per seal, just before it)."""
        served = [s for s in self.sources.values() if s.ready()] or list(self.sources.values())
        main = next(s for s in served if s.scheduler.schema() is not None)
        sources = {s.name: {"schema": s.scheduler.schema().to_json(), "url": s.shown,
                            "skipped_columns": s.discovery.skipped if s.discovery else {}}
                   for s in served if s.scheduler.schema() is not None}
        return {"schema": main.scheduler.schema().to_json(), "lmdb_path": str(self.settings.lmdb_path),
                "skipped_columns": main.discovery.skipped if main.discovery else {},
                "map_size": self.map_size, "seed": self.settings.seed, "source": main.shown,
                "cache_id": self.cache_id, "sources": sources,
                "remote_bytes": self.traffic.sealing()}
