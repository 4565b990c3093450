"""The daemon: wires remote discovery, the planner, the sampler pool and the writer."""

from __future__ import annotations

import collections
import logging
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from samplecache.record import FORMAT_VERSION, Schema
from samplecache.service.catalog import Catalog
from samplecache.service.encoder import UnsupportedColumn, column_for, infer_schema
from samplecache.service.epochs import EpochManager
from samplecache.service.planner import Pick, Planner, build_units
from samplecache.service.remote import FsspecRemote, RemoteError, classify_error
from samplecache.service.sampler import SampleResult, SampleTask
from samplecache.service.settings import Settings
from samplecache.service.staging import leftovers
from samplecache.service.supervisor import Supervisor
from samplecache.service.writer import Writer, open_env

log = logging.getLogger("samplecache.daemon")

MAX_ATTEMPTS = 3
FOOTER_THREADS = 8


class StartupError(Exception):
    """The daemon cannot start; the message says which setting to change."""


def map_size_for(max_bytes: int) -> int:
    """LMDB map size from the budget: room for the budget, one more shard's worth, and free pages."""
    return int(max_bytes) * 2 + (1 << 30)


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started = time.time()
        try:
            settings.cache_dir.mkdir(parents=True, exist_ok=True)
            settings.staging_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StartupError(f"cache_dir {settings.cache_dir}: {e}") from e
        self.map_size = map_size_for(settings.max_bytes)
        self.env, self.dbs = open_env(settings.lmdb_path, self.map_size)
        self.catalog = Catalog(self.env, self.dbs)
        self.writer = Writer(self.env, self.dbs, self.catalog)
        self._check_cache_identity()
        self.epochs = EpochManager(self.catalog, self.writer, self._manifest_fields, settings.epoch_wait_max)
        self.remote = FsspecRemote(settings.source, settings.storage_options) if settings.source else None
        self.planner: Planner | None = None
        self.supervisor = Supervisor(settings.samplers, self._on_result)
        self.schema: Schema | None = Schema.from_json(self.catalog.meta("schema")) if self.catalog.meta("schema") else None
        self.skipped_columns: dict[str, str] = self.catalog.meta("skipped_columns", {}) or {}
        self.paused_reason: str | None = None
        self.user_paused = False
        self.last_error: str | None = None
        self.remote_errors = 0
        self._attempts: dict[str, int] = collections.defaultdict(int)
        self._backoff_until = 0.0
        self._ingests: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=4096)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._skips = 0
        self.complete = False  # every remote unit is resident: nothing new to sample

    # -- start / stop ------------------------------------------------------------------------
    def _check_cache_identity(self) -> None:
        fmt = self.catalog.meta("format")
        if fmt is not None and fmt != FORMAT_VERSION:
            raise StartupError(f"cache_dir {self.settings.cache_dir} holds record format v{fmt}; this "
                               f"samplecache writes v{FORMAT_VERSION}: use a new --cache-dir")
        src = self.catalog.meta("source")
        if src is not None and self.settings.source and src != self.settings.source:
            raise StartupError(f"cache_dir {self.settings.cache_dir} holds a sample of {src!r}, not of "
                               f"--source {self.settings.source!r}: use another --cache-dir")
        if fmt is None or src is None:
            self.writer.put_meta({"format": FORMAT_VERSION, "source": self.settings.source}).result()

    def check_remote(self) -> None:
        """Fail fast at start when a fresh cache's source is unusable (raises StartupError)."""
        if self.remote is None:
            raise StartupError("source is not set: pass --source URL or SAMPLECACHE_SOURCE")
        if self.catalog.files():
            return  # known files: start from the cache and retry the remote in the background
        try:
            self.remote.list_files()
        except RemoteError as e:
            raise StartupError(str(e)) from e

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
        self.supervisor.stop(timeout=3)
        self.writer.close()
        self.env.close()

    def _recover_staging(self) -> None:
        n = 0
        for path in leftovers(self.settings.staging_dir):
            self.writer.ingest(path).result()
            n += 1
        if n:
            log.info("recovered %d staging file(s) from the previous run", n)

    # -- discovery -------------------------------------------------------------------------------
    def _discover(self) -> None:
        assert self.remote is not None
        paths = self.remote.list_files()
        known = self.catalog.files()
        new = [p for p in paths if p not in known]
        found: dict[str, dict[str, Any]] = {}

        def one(path: str) -> tuple[str, dict[str, Any], pa.Schema | None]:
            try:
                info, schema = self.remote.file_info(path)  # type: ignore[union-attr]
                return path, {"row_groups": list(info.row_groups), "size": info.size}, schema
            except Exception as e:
                if classify_error(e) == "unreachable":
                    raise
                return path, {"row_groups": [], "quarantined": True,
                              "reason": f"unreadable footer: {type(e).__name__}: {e}", "at": time.time()}, None

        with ThreadPoolExecutor(FOOTER_THREADS) as pool:
            for path, info, schema in pool.map(one, new):
                if schema is not None:
                    info = self._check_schema(path, info, schema)
                found[path] = info
        if found:
            self.writer.put_files(found).result()
        files = self.catalog.files()
        if self.schema is None:
            raise RemoteError(f"no readable Parquet file under source {self.settings.source!r}")
        units = build_units(files)
        self.planner = Planner(units, seed=self.settings.seed, cursor=self.catalog.meta("cursor"))
        log.info("source %s: %d files, %d row groups", self.settings.source, len(files), len(units))

    def _check_schema(self, path: str, info: dict[str, Any], arrow_schema: pa.Schema) -> dict[str, Any]:
        try:
            if self.schema is None:
                schema, skipped = infer_schema(arrow_schema, self.settings.columns)
                self.writer.put_meta({"schema": schema.to_json(), "skipped_columns": skipped,
                                      "arrow_schema": str(arrow_schema)}).result()
                self.schema, self.skipped_columns = schema, skipped
                return info
            for col in self.schema.columns:
                if col.name not in arrow_schema.names:
                    raise UnsupportedColumn(f"column {col.name!r} is missing")
                got = column_for(arrow_schema.field(col.name))
                if (got.kind, got.dtype, got.shape) != (col.kind, col.dtype, col.shape):
                    raise UnsupportedColumn(f"column {col.name!r} is {got.kind} {got.dtype} {got.shape}, "
                                            f"expected {col.kind} {col.dtype} {col.shape}")
            return info
        except UnsupportedColumn as e:
            return {"row_groups": [], "quarantined": True, "reason": f"schema mismatch: {e}", "at": time.time()}

    # -- the scheduling loop -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if self.planner is None:
                try:
                    self._discover()
                    self.last_error = None
                except Exception as e:  # remote down or bad: report, retry
                    self.last_error = f"{type(e).__name__}: {e}" if not isinstance(e, RemoteError) else str(e)
                    self.remote_errors += 1
                    log.warning("remote: %s (retrying in %.0fs)", self.last_error, self.settings.retry_seconds)
                    self._stop.wait(self.settings.retry_seconds)
                    continue
            self._fill()
            self._stop.wait(0.05)

    def _why_not_sample(self) -> str | None:
        assert self.planner is not None
        if self.complete and self.catalog.resident_units() < len(self.planner):
            self.complete, self._skips = False, 0
        if self.complete:
            return "the whole remote dataset is cached"
        if self.user_paused:
            return "paused by request"
        if time.monotonic() < self._backoff_until:
            return "remote unreachable: backing off"
        if self.catalog.resident_bytes >= self.settings.max_bytes:
            return "budget full"
        free = shutil.disk_usage(self.settings.cache_dir).free
        if free < self.settings.min_free_disk:
            return f"disk almost full: {free} bytes free < min_free_disk {int(self.settings.min_free_disk)}"
        return None

    def _fill(self) -> None:
        assert self.planner is not None and self.schema is not None
        self.paused_reason = self._why_not_sample()
        if self.paused_reason is not None:
            return
        schema_json = self.schema.to_json()
        while self.supervisor.pending() < 2 * self.supervisor.size:
            pick = self.planner.next()
            if pick is None:
                return
            if self.catalog.files().get(pick.unit.path, {}).get("quarantined"):
                self._finish(pick)
                continue
            if self.catalog.unit_resident(pick.unit.path, pick.unit.row_group):
                # already cached (a later pass): sampling it again would only duplicate samples
                self.planner.done(pick.cycle, pick.position)
                self._skips += 1
                if self._skips >= len(self.planner):
                    self.complete = True
                    return
                continue
            self._skips = 0
            self.supervisor.submit(SampleTask(
                key=f"c{pick.cycle}-u{pick.position}", source=self.settings.source,
                storage_options=dict(self.settings.storage_options), path=pick.unit.path,
                row_group=pick.unit.row_group, schema=schema_json, staging_dir=str(self.settings.staging_dir),
                block_bytes=int(self.settings.block_bytes), unit=pick.position, cycle=pick.cycle))

    def _finish(self, pick: Pick) -> None:
        """Mark a unit done without a shard (its file is quarantined)."""
        assert self.planner is not None
        cursor = self.planner.cursor_after(pick.cycle, pick.position)
        self.planner.done(pick.cycle, pick.position)
        self.writer.put_meta({"cursor": cursor})

    # -- results -----------------------------------------------------------------------------------
    def _on_result(self, r: SampleResult) -> None:
        t = r.task
        pick = Pick(t.cycle, t.unit, None)  # type: ignore[arg-type]
        if r.ok and r.staged:
            assert self.planner is not None
            fut = self.writer.ingest(Path(r.staged), cursor=self.planner.cursor_after)
            fut.add_done_callback(lambda f: self._ingested(f, r))
            return
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

    def _ingested(self, fut: Any, r: SampleResult) -> None:
        exc = fut.exception()
        if exc is not None:
            self.last_error = f"ingest failed: {type(exc).__name__}: {exc}"
            log.error("%s", self.last_error)
            assert self.planner is not None
            self.planner.retry(Pick(r.task.cycle, r.task.unit, None))  # type: ignore[arg-type]
            return
        assert self.planner is not None
        self.planner.done(r.task.cycle, r.task.unit)
        shard = fut.result()
        if shard is not None:
            self._ingests.append((time.time(), shard.rows, shard.bytes))

    def quarantine(self, path: str, reason: str) -> None:
        info = dict(self.catalog.files().get(path, {}))
        info.update(quarantined=True, reason=reason, at=time.time())
        self.writer.put_files({path: info})
        log.warning("quarantined %s: %s", path, reason)

    # -- reporting -----------------------------------------------------------------------------------
    def _manifest_fields(self) -> dict[str, Any]:
        assert self.schema is not None
        return {"schema": self.schema.to_json(), "lmdb_path": str(self.settings.lmdb_path),
                "map_size": self.map_size, "seed": self.settings.seed, "source": self.settings.source}

    def ingest_rate(self, window: float = 60.0) -> dict[str, float]:
        now = time.time()
        recent = [(t, r, b) for t, r, b in list(self._ingests) if now - t <= window]
        span = min(window, max(1e-9, now - self.started))
        return {"samples_per_s": sum(r for _, r, _ in recent) / span,
                "bytes_per_s": sum(b for _, _, b in recent) / span}

    def sampler_state(self) -> str:
        if self.planner is None:
            return "discovering" if self.last_error is None else "remote error"
        return "paused" if self.paused_reason else "sampling"
