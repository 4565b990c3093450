"""Where a job's epochs come from, in one process: the job, the manifests, the next epoch fetched ahead, the leases.

Framework-free (stdlib + numpy): the PyTorch dataset, and any other adapter,
asks it for an epoch's plan and a lease while it reads, and closes it when done.

An epoch's boundary never waits on the daemon longer than one call's deadline:
``wait`` (for ``min_samples``) is charged only until this process mapped its
first epoch (warm-up is met then; a later shortfall is a 503, retried within the
deadline), an epoch's manifest is sealed by its mapping so fetching it never
waits, and the lease of an epoch read to its end is released in the background
(its end waits ``END_WAIT`` at most).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from multiprocessing import util as mp_util
from typing import Any, Callable, Sequence

import numpy as np

from samplecache.api.client import DaemonError, daemon_url, deadline_setting, fetch_manifest
from samplecache.api.job import JobClient, job_name, new_run
from samplecache.api.lease import LeaseKeeper
from samplecache.format.manifest import Manifest
from samplecache.format.record import FORMAT_VERSION, FormatError, Schema
from samplecache.reading.blocks.layouts import Layout, MixedColumns, column_maps
from samplecache.reading.blocks.reader import CacheReader
from samplecache.reading.epoch_clock import EpochClock
from samplecache.reading.options import CacheOptions

log = logging.getLogger("samplecache.epochs")
CHUNK_BYTES = 16 << 20  # bytes decoded per read transaction (and held by a chunk's samples)
END_WAIT = 1.0  # seconds an epoch's end waits for its lease's release (a daemon answers in milliseconds)


class MissingColumn(KeyError):
    """Columns asked for that the cache does not serve: ``missing`` names them, ``available`` the columns there
    are, ``left_out`` those the daemon left out of the cache, with why."""

    def __init__(self, missing: Sequence[str], available: Sequence[str], left_out: dict[str, str] | None = None
                 ) -> None:
        self.missing, self.available, self.left_out = list(missing), list(available), dict(left_out or {})
        message = f"columns {self.missing} are not cached; the cache has {self.available}"
        if self.left_out:
            message += f"; left out by the daemon: {self.left_out}"
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0])


def check_columns(wanted: Sequence[str], names: Sequence[str], skipped: dict[str, str] | None) -> None:
    """Raise ``MissingColumn`` unless every column in ``wanted`` is among ``names``."""
    unknown = [c for c in wanted if c not in names]
    if unknown:
        raise MissingColumn(unknown, names, {c: why for c, why in (skipped or {}).items() if c in unknown})


class EpochPlan:
    """One job epoch's manifest, as this process reads it (``epoch``: the job's; ``daemon_epoch``: the daemon's)."""

    def __init__(self, manifest: dict[str, Any], columns: Sequence[str] | None, job_epoch: int | None = None,
                 fill_missing: bool = False) -> None:
        """``fill_missing``: a column one source of the manifest lacks reads as nulls from it (else that source
        cannot be read with the others: ``check_read``)."""
        parsed = Manifest.from_json(manifest)
        version = parsed.format_version
        if int(version) != FORMAT_VERSION:
            raise FormatError(f"record format version mismatch: the daemon serves v{version}, this samplecache "
                              f"client reads v{FORMAT_VERSION}: install matching versions")
        self.manifest = manifest
        self.daemon_epoch = parsed.epoch
        self.epoch = self.daemon_epoch if job_epoch is None else int(job_epoch)
        # the schema the job's columns are read in: the manifest's, or the first source's that has them all
        self._main = parsed.schema
        if parsed.sources and columns is not None and not set(columns) <= set(Schema.from_json(parsed.schema).names):
            self._main = next((parsed.source_schema(n) for n in parsed.source_names() if set(columns) <= set(
                Schema.from_json(parsed.source_schema(n)).names)), parsed.schema)
        self.schema = Schema.from_json(self._main)
        names = self.schema.names
        wanted = list(columns) if columns is not None else names
        check_columns(wanted, names, parsed.skipped_columns)
        self.cols = [self.schema.index(c) for c in wanted]
        table = parsed.table()
        self.ids, self.rows, self.rows_per_block = table[:, 0].copy(), table[:, 1].copy(), table[:, 3].copy()
        self.shard_bytes = table[:, 2].copy()
        self.total = int(self.rows.sum())
        sample_bytes = max(1, parsed.bytes // max(1, self.total))
        self.sample_bytes = sample_bytes
        self.chunk = int(min(4096, max(1, CHUNK_BYTES // sample_bytes)))  # positions per read transaction
        self.reader = CacheReader(parsed.lmdb_path, parsed.map_size, self.schema, cache_id=parsed.cache_id)
        self.orders: dict[Any, Any] = {}  # (seed, shuffle, window, mixture...) -> the epoch's global order
        # the named sources of its shards: each shard's (an index into source_names), and why a source cannot be
        # read with the others (a column it lacks, or holds as another type: layouts.column_maps)
        self.source_names, self.source_of = parsed.source_names(), parsed.source_of()
        self.source_problems: dict[str, str] = {}
        if parsed.sources:
            self._map_sources(parsed, fill_missing)

    def _map_sources(self, parsed: Manifest, fill_missing: bool) -> None:
        schemas = {n: Schema.from_json(parsed.source_schema(n)) for n in self.source_names}
        main = next((n for n in self.source_names if parsed.source_schema(n) == self._main), self.source_names[0])
        unified, maps, self.source_problems = column_maps(self.schema, main, self.cols, schemas, fill_missing)
        self.schema = self.reader.schema = unified  # the read columns' types unified over the sources
        layouts: dict[int, tuple[Schema, Layout, str]] = {}
        for s, name in enumerate(self.source_names):
            if name in maps and (not maps[name].plain or parsed.source_schema(name) != self._main):
                lay = (schemas[name], maps[name], name)
                layouts.update((sid, lay) for sid in self.ids[self.source_of == s].tolist())
        self.reader.layouts = layouts

    def read_chunk(self, spread: int = 1) -> int:
        """Positions read per read transaction from an order whose neighbouring positions read ``spread`` shards
        in turn (a mixture's sources): each shard keeps a one-source chunk's share, up to ``CHUNK_BYTES`` of the
        largest samples of any source (a chunk reads every block its positions touch: a mixture's at ``chunk``
        would read each block ``spread`` times)."""
        if spread <= 1:
            return self.chunk
        per = np.bincount(self.source_of, weights=self.shard_bytes, minlength=len(self.source_names))
        rows = np.bincount(self.source_of, weights=self.rows, minlength=len(self.source_names))
        widest = max(self.sample_bytes, int((per / np.maximum(rows, 1)).max(initial=0)))
        return int(min(self.chunk * spread, max(self.chunk, CHUNK_BYTES // max(1, widest))))

    def source_rows(self) -> dict[str, int]:
        """Each source's samples in this manifest."""
        got = np.bincount(self.source_of, weights=self.rows, minlength=len(self.source_names))
        return {n: int(r) for n, r in zip(self.source_names, got.tolist())}

    def check_read(self, names: Sequence[str]) -> None:
        """Raise ``MixedColumns`` when a source among ``names`` cannot be read with the others."""
        wrong = [self.source_problems[n] for n in names if n in self.source_problems]
        if wrong:
            raise MixedColumns(f"epoch {self.daemon_epoch}'s sources cannot be read together: " + "; ".join(wrong)
                               + " (no value is cast to fit: read the columns every source holds as types that "
                               "unify, or leave the source out of the mixture)")


def _close_at_exit(ref: "weakref.ref[EpochSource]") -> None:
    source = ref()
    if source is not None:
        source.close()


def _release(keepers: dict[int, LeaseKeeper], live: set[LeaseKeeper], ending: set[LeaseKeeper]) -> None:
    for keeper in list(keepers.values()) + list(live) + list(ending):
        keeper.release()
    keepers.clear()
    live.clear()
    ending.clear()


class EpochSource:
    """The epochs of one job as one process sees them. Copies made for DataLoader workers (fork or
    pickle) share the job and run, so every process of the run reads the same daemon epochs."""

    def __init__(self, cache: CacheOptions, clock: EpochClock) -> None:
        """``cache``: the daemon, the columns, the job, the leases. The environment is read here, once (the token
        and deadline ``cache`` leaves to it; DataLoader workers get the values with their copy)."""
        self.cache = cache
        self.url = daemon_url(cache.url)  # a bad URL is a ValueError now, not a connection failure later
        self.clock = clock
        self.columns = list(cache.columns) if cache.columns is not None else None
        self.job = cache.job  # the job read: the one given, else this run's; load_state takes a saved one over
        self.retries = cache.retries
        self.token = cache.token or os.environ.get("SAMPLECACHE_TOKEN") or None
        deadline = cache.deadline if cache.deadline is not None else os.environ.get("SAMPLECACHE_DEADLINE")
        self.deadline = deadline_setting(deadline)
        self.run = new_run()
        self.resume = False  # the job must exist (set by load_state_dict)
        self._client: JobClient | None = None
        self._plans: dict[int, EpochPlan] = {}
        self._recorded: set[int] = set()  # job epochs whose mixture this process told the daemon
        self._lock = threading.Lock()
        self._keepers: dict[int, LeaseKeeper] = {}  # leases taken ahead, with the next manifest
        self._live: set[LeaseKeeper] = set()  # leases of epochs being read in this process
        self._ending: set[LeaseKeeper] = set()  # leases of epochs read, their release sent in the background
        self.warm = False  # an epoch was mapped, so the cache held min_samples: later mappings do not wait
        self._threads: list[threading.Thread] = []
        self._ahead: dict[int, threading.Thread] = {}  # epoch -> the thread fetching it ahead
        self._ahead_failed: dict[int, Exception] = {}  # epoch -> why its fetch ahead failed
        self._started: set[int] = set()  # epochs whose reading started in this process
        self.closed = False
        self._pid = os.getpid()
        weakref.finalize(self, _release, self._keepers, self._live, self._ending)  # dropped: its leases go at once

    @property
    def job_name(self) -> str:
        return job_name(self.job, self.run)

    def attach(self) -> JobClient:
        """The job, attached once per process (the same run each time: every process gets one answer).
        A job restarted by name starts at its next epoch unless ``set_epoch`` said otherwise."""
        client = self._client
        if client is None or client.name != self.job_name or client.run != self.run:
            client = self._client = JobClient(self.url, self.job_name, self.run, self.token, self.retries,
                                              self.deadline)
        if client.start is None:
            self.clock.start_at(client.attach(self.resume))
        return client

    def resume_job(self, name: str | None) -> None:
        """Go on with the saved job ``name`` (a new run takes it over; it must exist on the daemon). A state
        that names no job (written by hand, or by an older client) reads as this dataset's own job."""
        if name is None:
            return
        self.job, self.resume, self._client = name, True, None
        with self._lock:
            self._plans.clear()

    def replay(self, epoch: int, daemon_epoch: int) -> None:
        """Make job epoch ``epoch`` read the sealed ``daemon_epoch`` (asked now, before any worker asks)."""
        self.attach().daemon_epoch(epoch, self.cache.min_samples, 0.0, replay=daemon_epoch)  # sealed: no wait

    def _await_ahead(self, epoch: int) -> Exception | None:
        """Wait for this process's fetch ahead of ``epoch`` if one is under way (it is about done: asking the
        daemon again beside it would only double the calls and the leases); the error it failed with while
        waited for (then the daemon just failed that very call: asking again would double the time to fail)."""
        with self._lock:
            t = self._ahead.get(epoch)
        if t is None or t is threading.current_thread() or not t.is_alive():
            return None
        t.join(self.deadline)
        with self._lock:
            return self._ahead_failed.pop(epoch, None)

    def plan(self, epoch: int, ready: Callable[[EpochPlan], None] | None = None) -> EpochPlan:
        """The manifest of job epoch ``epoch`` (fetched once per process; the job's first request seals it).
        ``ready(plan)`` runs on a plan fetched now, before any other thread can see it (work done ahead)."""
        with self._lock:
            got = self._plans.get(epoch)
        if got is None:
            failed = self._await_ahead(epoch)
            with self._lock:
                got = self._plans.get(epoch)
            if got is None and failed is not None:
                raise failed
        if got is None:
            # The long poll for min_samples is warm-up's: once an epoch was mapped it would only stretch the
            # time a stopped daemon takes to fail. The mapping seals the epoch, so its manifest never waits.
            wait, min_samples = (0.0 if self.warm else self.cache.wait), self.cache.min_samples
            daemon_epoch = self.attach().daemon_epoch(epoch, min_samples, wait)
            self.warm = True
            with self._lock:  # job epochs read the same sealed daemon epoch while the cache did not change
                same = next((p.manifest for p in self._plans.values() if p.daemon_epoch == daemon_epoch), None)
            manifest = same if same is not None else fetch_manifest(
                self.url, daemon_epoch, min_samples, 0.0, self.token, self.retries, self.deadline)
            got = EpochPlan(manifest, self.columns, epoch, self.cache.fill_missing)
            if ready is not None:
                ready(got)
            with self._lock:
                self._plans[epoch] = got
                for old in [e for e in self._plans if e < epoch - 1]:
                    del self._plans[old]
        return got

    def cached_plan(self, epoch: int) -> EpochPlan | None:
        """The manifest of job epoch ``epoch`` if this process has it (never asks the daemon)."""
        with self._lock:
            return self._plans.get(epoch)

    def _new_keeper(self, plan: EpochPlan, holder: str) -> LeaseKeeper:
        return LeaseKeeper(self.url, plan.daemon_epoch, self.token, holder=holder, job=self.job_name,
                           run=self.run, job_epoch=plan.epoch, deadline=self.deadline)

    def _store_ahead(self, epoch: int, keeper: LeaseKeeper) -> None:
        """Keep a lease taken ahead for ``epoch``, unless that epoch already started (or the source closed):
        then nothing would ever pop it, so it goes at once."""
        with self._lock:
            late = self.closed or epoch in self._started or epoch in self._keepers
            if not late:
                self._keepers[epoch] = keeper
        if late:
            keeper.release()

    def prefetch_next(self, epoch: int, holder: str, lease: bool = True,
                      ready: Callable[[EpochPlan], None] | None = None) -> None:
        """Fetch (so seal) the next epoch's manifest and take its lease (unless ``lease`` is False) in a thread,
        before this epoch ends."""
        def run() -> None:
            try:
                plan = self.plan(epoch, ready)
                # Lease it now, so its shards stay pinned until it is read. A worker that is not persistent
                # releases it unread when it exits, which keeps the epoch pinned for the next workers' leases.
                if lease and self.cache.lease and epoch not in self._keepers and epoch not in self._started \
                        and not self.closed:
                    self._store_ahead(epoch, self._new_keeper(plan, holder))
            except (DaemonError, KeyError, ValueError) as e:
                # the next iteration reports it if it waited for this call, else fetches the epoch again
                with self._lock:
                    self._ahead_failed[epoch] = e
        t = threading.Thread(target=run, name=f"samplecache-prefetch-{self.job_name}-{epoch}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        with self._lock:
            self._ahead = {e: x for e, x in self._ahead.items() if x.is_alive()}
            self._ahead[epoch] = t
            # a failure nobody waited for is dropped once its epoch is past (the boundary fetched it itself)
            self._ahead_failed = {e: x for e, x in self._ahead_failed.items() if epoch - 1 <= e < epoch}
        if self._pid != os.getpid():
            # a DataLoader worker: when it exits (through os._exit, after multiprocessing's finalizers), wait for
            # this thread and release what it leased, or a lease taken in the last moment outlives the worker
            self._pid = os.getpid()
            mp_util.Finalize(None, _close_at_exit, args=(weakref.ref(self),), exitpriority=20)
        t.start()

    def keeper(self, plan: EpochPlan, holder: str) -> LeaseKeeper | None:
        """This epoch's lease while it is read: the one taken ahead with its manifest, or a new one. Leases
        taken ahead for epochs up to this one that nobody will read now are released."""
        self._await_ahead(plan.epoch)
        with self._lock:
            self._started = {e for e in self._started if e >= plan.epoch - 4} | {plan.epoch}
            got = self._keepers.pop(plan.epoch, None)
            stale = [self._keepers.pop(e) for e in [e for e in self._keepers if e < plan.epoch]]
        for old in stale:
            old.release()
        if got is None or got.lost is not None or not got.alive():
            if got is not None:
                got.release()
            got = self._new_keeper(plan, holder) if self.cache.lease else None
        if got is not None:
            self._live.add(got)
        return got

    def record_mixture(self, epoch: int, record: dict[str, Any]) -> None:
        """Tell the daemon the mixture job epoch ``epoch`` reads (once per process and epoch), in a thread: the
        epoch's first batch does not wait for it. A daemon that cannot take it is logged, never an error: the
        record is for people."""
        with self._lock:
            if epoch in self._recorded:
                return
            self._recorded = {e for e in self._recorded if e > epoch - 16} | {epoch}  # a long run: recent ones
        job = self.attach()

        def send() -> None:
            try:
                job.record_mixture(epoch, record)
            except DaemonError as e:
                log.warning("could not record job %s epoch %d's mixture on the daemon: %s", self.job_name, epoch, e)
        t = threading.Thread(target=send, name=f"samplecache-mixture-{self.job_name}-{epoch}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def done(self, keeper: LeaseKeeper | None) -> None:
        """The epoch was read (or reading stopped): release its lease, waiting at most ``END_WAIT`` for the
        daemon (the release goes on in the background; ``close`` waits for it)."""
        if keeper is not None:
            keeper.release(wait=END_WAIT)
            self._live.discard(keeper)
            self._ending.difference_update([k for k in self._ending if not k.releasing()])
            if keeper.releasing():
                self._ending.add(keeper)

    def close(self) -> None:
        """Release every lease now (those taken ahead too) and stop this process's threads."""
        self.closed = True
        for t in list(self._threads):
            t.join(timeout=10)
        _release(self._keepers, self._live, self._ending)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lock"] = None
        state["_keepers"], state["_live"], state["_threads"], state["_started"] = {}, set(), [], set()
        state["_ending"], state["_ahead"], state["_ahead_failed"] = set(), {}, {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        weakref.finalize(self, _release, self._keepers, self._live, self._ending)
