"""The scheduler: the one owner of the daemon's sampling state.

One thread runs it. Everything that changes sampling state happens on that thread: sampler results (from the
supervisor's thread) and ingest completions (from the writer's thread) arrive as events in its inbox, and
HTTP control requests run through ``call`` and wait for their answer. Nothing else writes these fields.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
import zlib
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, TypeVar

import lmdb

from samplecache_service.config.settings import DEFAULT_SOURCE, Settings
from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.planner import Pick, Planner, Slot, Unit, build_units, unit_current
from samplecache_service.remote.stores import ErrorKind, RemoteError, classify_error
from samplecache_service.sampling.backoff import Backoff
from samplecache_service.sampling.failures import CORRUPT_CONFIRMATIONS, MAX_UNIT_ATTEMPTS, UnitFailures
from samplecache_service.sampling.inbox import Inbox
from samplecache_service.sampling.sampler import SampleResult, SampleTask
from samplecache_service.sampling.traffic import Traffic
from samplecache_service.store.budget import Budget, ShareOf
from samplecache_service.store.catalog import Catalog, source_key
from samplecache_service.store.disk import DiskSpace, out_of_space
from samplecache_service.store.eviction import MakeRoom
from samplecache_service.store.fileinfo import FileInfo
from samplecache_service.store.staging import drop_failed
from samplecache_service.store.writer import DamagedShard, NoRoom, Writer

log = logging.getLogger("samplecache.daemon")

# what follows a failed first listing: a fresh cache needs a readable source, so the daemon does not start
AT_START_FAILED = "the daemon does not start: serve exits 1"
T = TypeVar("T")


class Samplers(Protocol):
    """What the scheduler asks of the sampler processes (``supervisor.Supervisor``)."""

    size: int

    def submit(self, task: SampleTask) -> None: ...

    def pending(self) -> int: ...

    def crash_loop(self) -> str | None: ...


class Scheduler:
    def __init__(self, settings: Settings, catalog: Catalog, writer: Writer, disk: DiskSpace, traffic: Traffic,
                 supervisor: Samplers, budget: Budget | ShareOf, discovery: Discovery | None, *,
                 pinned_epochs: Callable[[], Iterable[int]], make_room: MakeRoom,
                 expire_leases: Callable[[], None], die: Callable[[str], None], source_shown: str = "",
                 clock: Callable[[], float] = time.monotonic, name: str = DEFAULT_SOURCE, url: str | None = None,
                 owns: Callable[[str], bool] | None = None, slots: Callable[[], int] | None = None) -> None:
        """``pinned_epochs``, ``make_room``, ``expire_leases``: the epochs' pins, the eviction plan for a shard
        on its way in, and the lease expiry run each turn; ``die``: stop the daemon (LMDB cannot go on).

        One scheduler samples one named source (``name``, at ``url``; ``budget`` is its share) beside the
        others: ``owns`` tells its files from theirs, and ``slots`` is how many units it may have out at the
        shared samplers (default: twice their number)."""
        self.settings, self.catalog, self.writer, self.disk, self.traffic = settings, catalog, writer, disk, traffic
        self.supervisor, self.budget, self.discovery = supervisor, budget, discovery
        self.pinned_epochs, self.make_room, self.expire_leases, self.die = pinned_epochs, make_room, expire_leases, die
        self.source_shown, self.clock = source_shown, clock
        self.name, self.url = name, settings.source if url is None else url
        self.owns = owns or (lambda path: True)
        self.slots = slots or (lambda: 2 * supervisor.size)
        self._out = 0  # units of this source at the samplers
        # task keys name the source (so results find their way back); the default source's keep the old form
        self.key_prefix = "" if name == DEFAULT_SOURCE else f"{name}."
        self.planner: Planner | None = None
        self.paused_reason: str | None = None
        self.user_paused = False
        self.complete = False  # every readable remote unit is resident: nothing new to sample
        self.disk_full: str | None = None
        self._full_since: float | None = None  # since when writes fail for want of space (until one succeeds)
        self.last_error: str | None = None
        self.remote_errors = 0
        self.evicted_shards = 0
        self.quarantined_units = 0  # this node's units in quarantined files (or stale: their file was re-planned)
        self.removed_units = 0  # this node's units in files no longer live in their table (never sampled again)
        self.failures = UnitFailures()
        self._skips = 0
        self._files_seen = -1
        # (files version, units here) -> quarantined files with no units here, and files with units here
        self._unread: tuple[tuple[int, int, int], list[str], int] = ((-1, -1, -1), [], 0)
        self._deferred: Backoff[Pick | Slot] = Backoff(self.clock)  # units waiting out their backoff
        self._backoff_until = self._held_retry_at = self._next_discovery = 0.0
        self._retrying = 0  # held results re-submitted and not answered yet
        self._ingesting = 0  # bytes of shards sampled and on their way to the writer
        self._held: collections.deque[SampleResult] = collections.deque()  # staged, waiting for room
        self.ingests: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=4096)
        self.inbox = Inbox()  # results, ingest completions and control requests, run on this thread

    @property
    def unit_failures(self) -> collections.Counter[str]:
        """Failed units by kind (status, metrics)."""
        return self.failures.by_kind

    @property
    def units_given_up(self) -> int:
        return self.failures.units_given_up

    @property
    def given_up(self) -> set[tuple[str, int]]:
        return self.failures.given_up

    def schema(self) -> Any:
        return self.discovery.schema if self.discovery else None

    def state(self) -> str:
        """discovering | remote error | crash loop | paused | sampling"""
        if self.planner is None:
            return "discovering" if self.last_error is None else "remote error"
        if self.supervisor.crash_loop():  # samplers die at start: nothing samples, whatever else holds
            return "crash loop"
        return "paused" if self.paused_reason else "sampling"

    def coverage(self) -> dict[str, Any] | None:
        """The planner's coverage, where units of quarantined files, and units given up after failing again and
        again this pass, never count as sampled (``units_left_out``). A file quarantined before its footer was
        read has no units: it is left out as one unit with the rows of the mean file here (``files_unread``),
        so that coverage never reads complete while a file is unreadable."""
        if self.planner is None:
            return None
        files = self.catalog.files()
        given_up = set(self.failures.given_up)
        cov = self.planner.coverage(lambda u: u.path in files and files[u.path].quarantined
                                    or (u.path, u.row_group) in given_up,
                                    hash((self.catalog.files_version, frozenset(given_up))),
                                    removed=lambda u: self._gone(u.path, files.get(u.path)))
        unread, planned = self._unread_files()
        if unread:
            rows = len(unread) * max(1, round(cov["rows"] / max(1, planned)))
            cov.update(units=cov["units"] + len(unread), units_left_out=cov["units_left_out"] + len(unread),
                       rows=cov["rows"] + rows, rows_left_out=cov["rows_left_out"] + rows)
            cov.update(unit_fraction=cov["units_sampled"] / cov["units"],
                       row_fraction=cov["rows_sampled"] / cov["rows"])
        cov["files_unread"] = len(unread)
        return cov

    def _unread_files(self) -> tuple[list[str], int]:
        """Quarantined files with no units here (their footer could not be read, so their row groups are not
        known), and how many files have units here; counted again only when the files or the units change."""
        assert self.planner is not None
        outside = self._outside()  # replaced at each listing
        key = (self.catalog.files_version, len(self.planner), id(outside))
        if self._unread[0] != key:
            planned = {u.path for u in self.planner.units}
            unread = sorted(p for p, i in self.catalog.files().items() if i.quarantined and not i.row_groups
                            and p not in planned and self.owns(p) and p not in outside)
            self._unread = (key, unread, len(planned))
        return self._unread[1], self._unread[2]

    def post(self, event: Callable[[], None]) -> None:
        self.inbox.post(event)

    def call(self, fn: Callable[[], T]) -> "Future[T]":
        return self.inbox.call(fn)

    # -- the loop ------------------------------------------------------------------------------------
    def step(self) -> None:
        """One turn of the loop (run supervised by ``Health.run_loop``)."""
        self.inbox.drain(0.05)
        if self.clock() >= self._next_discovery:
            self.discover()
        if self.planner is not None and self.schema() is not None:
            self.expire_leases()
            self._retry_held()
            self._release_deferred()
            self._fill()

    def discover(self, at_start: bool = False) -> None:
        """List the source (see Discovery.run); ``at_start``: the daemon's first listing, whose failure stops the
        start (``Daemon.check_remote``) instead of being retried, and the warning says so."""
        discovery = self.discovery
        assert discovery is not None
        try:
            new = [p for p in discovery.run() if self.owns(p)]
            self.last_error = None if self.planner is not None or self.schema() else self.last_error
            outside = self._outside()
            files = {p: i for p, i in self.catalog.files().items() if self.owns(p) and p not in outside}
            if self.planner is None and self.schema() is not None:
                units = build_units(files)
                self.planner = Planner(units, seed=self.settings.seed, node_rank=self.settings.node_rank,
                                       num_nodes=self.settings.num_nodes,
                                       cursor=self.catalog.meta(source_key(self.name, "cursor")))
                log.info("source %s: %d files, %d row groups in %d units (%d units on this node)",
                         self.source_shown, len(files), sum(u.row_groups for u in units), len(units),
                         len(self.planner),
                         extra={"event": "source_planned", "path": self.source_shown})
                self.last_error = None
            elif self.planner is not None:
                # and files another source of the same table read first (one filter inside the other's)
                planned = self.planner.paths
                new = sorted(set(new) | {p for p, i in files.items() if i.row_groups and p not in planned})
                if new:
                    self.planner.add_units(build_units({p: files[p] for p in new}))
            self.complete = self.complete and not new
            self._files_seen = -1
            if (getattr(discovery, "is_table", False) or outside) and (
                    discovery.removed_now or self._stale_resident()):
                # shards of files that left the table or the filter: evicted now, unless a lease still pins them
                self.writer.evict(self.make_room, "removed").add_done_callback(self.count_evicted)
            self._next_discovery = self.clock() + self.settings.discover_interval
        except Exception as e:  # remote down or bad: report, retry
            self.last_error = str(e) if isinstance(e, RemoteError) else f"{type(e).__name__}: {e}"
            self.remote_errors += 1
            then = AT_START_FAILED if at_start else f"retrying in {self.settings.retry_seconds:.0f}s"
            log.warning("remote: %s (%s)", self.last_error, then,
                        extra={"event": "discovery_failed", "error_class": classify_error(e)})
            self._next_discovery = self.clock() + self.settings.retry_seconds

    def _stale_resident(self) -> bool:
        """Whether a resident shard of this source comes from a file no longer live in its table or its filter."""
        removed, outside = self.catalog.removed_files(), self._outside()
        return bool(removed or outside) and any(s.path in removed or s.path in outside for s in self.catalog.shards()
                                                if s.source == self.name)

    def _outside(self) -> frozenset[str]:
        """The files this source's filter leaves out (its last listing's)."""
        return frozenset(getattr(self.discovery, "outside_files", ()))

    def _gone(self, path: str, info: FileInfo | None) -> bool:
        """Whether ``path`` is out of this source's data: it left its table, or the filter leaves it out."""
        return info is not None and info.removed or path in self._outside()

    def discover_soon(self) -> None:
        self._next_discovery = 0.0

    # -- deciding ---------------------------------------------------------------------------------------
    def _why_not_sample(self) -> str | None:
        assert self.planner is not None
        settled = self.catalog.resident(self.name).units + self.quarantined_units + self.removed_units
        if self.complete and settled < len(self.planner):
            self.complete, self._skips = False, 0
        if self.user_paused:
            return "paused by request"
        refused = getattr(self.discovery, "refused", None)
        if refused:  # the table took on a feature that cannot be served: its newest rows are not known
            return str(refused)
        if self.disk_full:
            free = self.disk.free()
            if free < self.budget.min_free_disk or self.clock() < self._backoff_until:
                return self.disk_full
            # try again; "disk space is back" is said once a shard is written, not at every retry
            self.disk_full = None
            log.debug("retrying after a full disk (%d bytes free for shards)", free, extra={"event": "disk_full"})
        if self._held or self._retrying:
            pinned = sorted(self.pinned_epochs())
            waiting = len(self._held) + self._retrying
            need = min((r.bytes for r in list(self._held)), default=0)
            room = (f"every evictable shard is pinned by leases on epochs {pinned}" if pinned else
                    "nothing is pinned, yet the shard does not fit")
            return (f"budget full: {room}; {waiting} shard(s) wait (the smallest {need} bytes; budget "
                    f"{self.budget.max_bytes}, resident {self.catalog.resident(self.name).bytes} bytes)")
        if self.complete:
            unread = len(self._unread_files()[0])
            left = [f"{self.quarantined_units} unit(s) of quarantined files"] if self.quarantined_units else []
            left += [f"{unread} quarantined file(s) whose footer cannot be read"] if unread else []
            if left:
                return f"every readable unit is cached; {' and '.join(left)} are left out (GET /v1/quarantine)"
            return "the whole remote dataset is cached"
        if self.clock() < self._backoff_until:
            return "remote unreachable: backing off"
        free = self.disk.free()
        if free < self.budget.min_free_disk:
            return f"disk almost full: {free} bytes free < min_free_disk {self.budget.min_free_disk}"
        staging = self.supervisor.size * self.settings.part_bytes
        if self.budget.min_free_disk and self.disk.fs_free < staging:  # --min-free-disk 0: no guard at all
            return (f"disk almost full: {self.disk.fs_free} bytes free on the filesystem, less than the staging "
                    f"files of {self.supervisor.size} sampler(s) need ({staging}); LMDB's free pages do not hold them")
        return None

    def _settled(self, unit: Unit) -> bool:
        """Nothing to sample for ``unit``: resident from an earlier pass, its file quarantined or re-planned."""
        info = self.catalog.file(unit.path)
        if info.quarantined or self._gone(unit.path, info) or not unit_current(unit, info):
            return True
        return self.catalog.unit_resident(unit.path, unit.row_group, self.name) and \
            not self.failures.incomplete((unit.path, unit.row_group))

    def _fill(self) -> None:
        assert self.planner is not None
        catalog = self.catalog
        if self._files_seen != catalog.files_version:
            self._files_seen = catalog.files_version
            self.quarantined_units = sum(1 for u in self.planner.units if catalog.file(u.path).quarantined
                                         or not unit_current(u, catalog.file(u.path)))
            self.removed_units = sum(1 for u in self.planner.units if self._gone(u.path, catalog.file(u.path)))
        self.paused_reason = self._why_not_sample()
        if self.paused_reason is not None:
            return
        supervisor = self.supervisor
        while supervisor.pending() < 2 * supervisor.size and self._out < self.slots():
            pick = self.planner.next()
            if pick is None:
                if self._deferred and not supervisor.pending():
                    self.paused_reason = (f"waiting to retry {len(self._deferred)} unit(s) after failures (backoff; "
                                          f"last error: {self.last_error})")
                return
            if self._settled(pick.unit):
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
        info = self.catalog.file(pick.unit.path)
        sizes = info.row_group_bytes or ()
        size = int(sizes[pick.unit.row_group]) if pick.unit.row_group < len(sizes) else 0
        committed = self.catalog.resident(self.name).bytes + self._ingesting + self.traffic.out_bytes(self.mine) + \
            sum(r.bytes for r in list(self._held))
        # the unit's identity in the key: after a cursor reset the same cycle and position may name another unit
        ident = zlib.crc32(f"{pick.unit.path}\0{pick.unit.row_group}".encode())
        key = f"{self.key_prefix}c{pick.cycle}-u{pick.position}-{ident:08x}"
        self.paused_reason = self.traffic.admit(key, size, committed, self.budget.max_bytes, self.name)
        if self.paused_reason is not None:
            return False
        schema = self.schema()
        assert schema is not None
        self.supervisor.submit(SampleTask(
            key=key, name=self.name, source=self.url, storage_options=dict(self.settings.storage_options),
            path=pick.unit.path, row_group=pick.unit.row_group, schema=schema.to_json(),
            staging_dir=str(self.settings.staging_dir), block_bytes=int(self.settings.block_bytes),
            unit=pick.position, cycle=pick.cycle, row_groups=pick.unit.row_groups,
            part_bytes=self.settings.part_bytes, arrow_schema=self.discovery.target_text() if self.discovery else None,
            file_size=info.size or 0, footer_bytes=info.footer or 0, partitions=dict(info.partitions)))
        self._out += 1
        return True

    def mine(self, key: str) -> bool:
        """Whether a task key is one of this source's."""
        return key.startswith(self.key_prefix) if self.key_prefix else "." not in key

    def _finish(self, pick: Pick | Slot) -> None:
        """Mark a unit done without a shard (its file is quarantined)."""
        assert self.planner is not None
        cursor = self.planner.cursor_after(pick.cycle, pick.position)
        self.planner.done(pick.cycle, pick.position)
        self.writer.put_meta({source_key(self.name, "cursor"): cursor})

    def _defer(self, pick: Pick | Slot, unit_key: tuple[str, int], first: float | None = None) -> float:
        """Try ``pick`` again after an exponential backoff with jitter; returns the delay."""
        base = self.settings.retry_seconds if first is None else first
        return self._deferred.defer(pick, self.failures.attempts(unit_key), base)

    def _give_up(self, pick: Pick | Slot, unit_key: tuple[str, int], kind: str) -> None:
        """Stop retrying a unit for this pass (the next pass tries it again): one unit that always fails must
        not hold up the cycle. Its file is not quarantined: nothing says its bytes are bad."""
        self.failures.give_up(unit_key)
        log.error("giving up on %s row group %d for this pass after %d failed attempts (the next pass tries it "
                  "again): %s", unit_key[0], unit_key[1], MAX_UNIT_ATTEMPTS, self.last_error,
                  extra={"event": "unit_given_up", "path": unit_key[0], "unit": unit_key[1], "error_class": kind})
        self._finish(pick)

    def _release_deferred(self) -> None:
        if not self._deferred or self.planner is None:
            return
        for pick in self._deferred.due():
            self.planner.retry(pick)

    # -- results (events from the supervisor's thread) ---------------------------------------------------
    def on_result(self, r: SampleResult) -> None:
        """Called on the supervisor's thread: handled on ours."""
        self.post(lambda: self._result(r))

    def _result(self, r: SampleResult) -> None:
        self.traffic.returned(r)
        self._out = max(0, self._out - 1)
        t = r.task
        if r.ok:
            self.failures.sampled((t.path, t.row_group), t.key)
            parts = r.parts or ([(r.staged, r.bytes)] if r.staged else [])
            for k, (staged, size) in enumerate(parts):
                self._ingest(dataclasses.replace(r, staged=staged, bytes=size, parts=[],
                                                 final=k == len(parts) - 1))
            if not parts:
                self._finish(Slot(t.cycle, t.unit))
            return
        pick = Slot(t.cycle, t.unit)
        kind = r.error_kind or ErrorKind.TRANSIENT
        self.remote_errors += 1
        self.failures.by_kind[kind] += 1
        self.last_error = f"{t.path} row group {t.row_group}: {r.error}"
        failed = {"event": "sample_failed", "path": t.path, "unit": t.row_group, "error_class": kind}
        assert self.planner is not None
        if kind == ErrorKind.SCHEMA:
            self.quarantine(t.path, r.error or "does not fit the dataset's schema", kind=ErrorKind.SCHEMA)
            self._finish(pick)
            return
        unit_key = (t.path, t.row_group)
        if kind in (ErrorKind.DISK, ErrorKind.UNREACHABLE):
            self.failures.not_a_read(unit_key)
        if kind == ErrorKind.DISK:
            self._disk_full(r.error or "no space left", "while staging a shard")
            self.planner.retry(pick)
            return
        if kind == ErrorKind.UNREACHABLE:
            log.warning("sampling failed (remote unreachable): %s", self.last_error, extra=failed)
            self._backoff_until = self.clock() + self.settings.retry_seconds
            self.planner.retry(pick)
            return
        # replaced since it was listed: list it again now; the unit is retried as transient
        if kind == ErrorKind.CHANGED:
            self.discover_soon()
        unparsable = self.failures.failed_read(unit_key, kind == ErrorKind.CORRUPT)
        if unparsable >= CORRUPT_CONFIRMATIONS:
            self.failures.quarantined(unit_key)
            self.quarantine(t.path, r.error or "unparsable", kind=ErrorKind.CORRUPT)
            self._finish(pick)
            return
        if unparsable:
            # confirm with a fresh read soon: the wait counts the unparsable reads, not earlier transient failures
            delay = self._deferred.defer(pick, unparsable, 1.0)
            log.warning("sampling failed (unparsable bytes; read again in %.1fs to confirm): %s", delay,
                        self.last_error, extra=failed)
            return
        if self.failures.exhausted(unit_key):
            self._give_up(pick, unit_key, kind)
            return
        delay = self._defer(pick, unit_key)
        log.warning("sampling failed (%s, attempt %d; again in %.1fs): %s", kind, self.failures.attempts(unit_key),
                    delay, self.last_error, extra=failed)

    def _ingest(self, r: SampleResult, retry: bool = False) -> None:
        assert self.planner is not None and r.staged is not None
        self._ingesting += r.bytes
        fut = self.writer.ingest(Path(r.staged), cursor=self.planner.cursor_after, make_room=self.make_room)
        fut.add_done_callback(lambda f: self.post(lambda: self._ingested(f, r, retry)))

    def _retry_held(self) -> None:
        if not self._held or self.clock() < self._held_retry_at or (
                self.disk_full and self.clock() < self._backoff_until):
            return
        self._held_retry_at = self.clock() + 0.5
        for _ in range(len(self._held)):
            self._retrying += 1
            self._ingest(self._held.popleft(), retry=True)

    def _ingested(self, fut: "Future[Any]", r: SampleResult, retry: bool = False) -> None:
        assert self.planner is not None
        exc = fut.exception()
        self._ingesting -= r.bytes
        if retry:
            self._retrying -= 1
        if isinstance(exc, NoRoom):
            self._held.append(r)  # backpressure: wait for a lease to end; the budget is never exceeded
            return
        if isinstance(exc, lmdb.PanicError):
            self.die(f"the LMDB environment cannot go on: {type(exc).__name__}: {exc}")
            return
        if out_of_space(exc):
            self._disk_full(f"{type(exc).__name__}: {exc}", "while ingesting")
            self._held.append(r)  # the shard waits for room
            return
        unit_key = (r.task.path, r.task.row_group)
        if exc is not None:
            self.last_error = f"ingest failed: {type(exc).__name__}: {exc}"
            log.error("%s", self.last_error, extra={"event": "ingest_failed", "path": r.task.path,
                                                    "unit": r.task.row_group, "error_class": ErrorKind.INGEST})
            if r.staged:  # the unit is sampled again
                drop_failed(Path(r.staged), damaged=isinstance(exc, DamagedShard))
            if not self.failures.ingest_failed(unit_key, r.task.key, ErrorKind.INGEST):
                return  # another part of this round failed before: the unit is retried once
            if self.failures.exhausted(unit_key):
                self._give_up(Slot(r.task.cycle, r.task.unit), unit_key, ErrorKind.INGEST)
            else:
                self._defer(Slot(r.task.cycle, r.task.unit), unit_key)
            return
        if r.final and self.failures.all_parts_in(unit_key, r.task.key):
            self.planner.done(r.task.cycle, r.task.unit)
        self._space_back()
        done = fut.result()
        self.evicted_shards += len(done.evicted)
        if done.shard is not None:
            self.ingests.append((time.time(), done.shard.rows, done.shard.bytes))
            s = done.shard
            log.info("shard %d ingested: %d rows, %d bytes from %s row group %d (%d evicted for room)", s.id, s.rows,
                     s.bytes, s.path, s.row_group, len(done.evicted), extra={"event": "shard_ingested", "shard": s.id,
                     "rows": s.rows, "bytes": s.bytes, "path": s.path, "unit": s.row_group})

    def _disk_full(self, error: str, where: str) -> None:
        self.disk_full = f"disk full {where}: {error} (sampling resumes once min_free_disk is free again)"
        self._backoff_until = self.clock() + self.settings.retry_seconds
        self.last_error = self.disk_full
        if self._full_since is None:
            self._full_since = self.clock()
            log.error("%s", self.disk_full, extra={"event": "disk_full"})
        else:  # the retries of one full disk: status shows it; the log said it once
            log.debug("%s", self.disk_full, extra={"event": "disk_full"})

    def _space_back(self) -> None:
        """A shard was written: a full disk, if there was one, has room again."""
        if self._full_since is None:
            return
        log.info("disk space is back after %.0f s (%d bytes free for shards): sampling resumes",
                 self.clock() - self._full_since, self.disk.free(), extra={"event": "disk_space_back"})
        self._full_since = None

    def quarantine(self, path: str, reason: str, kind: ErrorKind = ErrorKind.CORRUPT) -> None:
        info = self.catalog.file(path)
        if info.quarantined:
            return
        self.writer.put_files({path: info.quarantine(reason, kind)})
        log.warning("quarantined %s: %s", path, reason,
                    extra={"event": "file_quarantined", "path": path, "error_class": kind})

    # -- control (run through ``call``) -------------------------------------------------------------------
    def set_paused(self, paused: bool) -> None:
        self.user_paused = paused
        self.refresh_reason()

    def refresh_reason(self) -> None:
        if self.planner is not None:
            self.paused_reason = self._why_not_sample()

    def count_evicted(self, fut: "Future[Any]") -> None:
        """An eviction future's callback (any thread): counted on ours."""
        def event() -> None:
            if fut.exception() is None:
                self.evicted_shards += len(fut.result())
        self.post(event)
