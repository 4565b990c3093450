"""SIGHUP: read the settings again (flags, environment, config file) and apply those that can change while running.

The settings that can change at run time are the ones ``PATCH /v1/config`` changes, plus the log level. A changed
setting of any other kind is logged as needing a restart and stays as it is. A config file that cannot be read or
holds a bad value changes nothing: the daemon keeps running on the settings in use and logs why.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from samplecache_service.config.file import ConfigError, Loaded, load, table_traps
from samplecache_service.config.settings import Settings
from samplecache_service.errors import Conflict, Invalid


class Configurable(Protocol):
    """What a reload changes: the run-time settings in use (``Daemon.runtime_config`` / ``Daemon.configure``)."""

    def runtime_config(self) -> dict[str, Any]: ...

    def configure(self, **changes: Any) -> Future[None]: ...

    def set_sources(self, named: dict[str, tuple[str, float]],
                    filters: dict[str, str | None] | None = None) -> dict[str, list[str]]: ...

log = logging.getLogger(__name__)

# setting name -> the keyword of Daemon.configure
DAEMON_RUNTIME = {"max_bytes": "max_bytes", "eviction_policy": "policy", "min_free_disk": "min_free_disk",
                  "epoch_max_samples": "epoch_max_samples", "pacing": "pacing",
                  "replace_per_epoch": "replace_per_epoch", "max_ingest_rate": "max_ingest_rate"}
SOURCES = frozenset({"source", "sources", "share"})  # applied together: Daemon.set_sources(named_sources())
RUNTIME = frozenset(DAEMON_RUNTIME) | {"log_level"} | SOURCES


def changes(old: Settings, new: Settings, live: Mapping[str, Any] | None = None
            ) -> tuple[dict[str, Any], list[str]]:
    """(runtime settings to apply: name -> new value, names of changed settings that need a restart).

    A runtime setting is applied when its new value differs from the value in use (``live``: what
    ``PATCH /v1/config`` or an earlier reload left), so a reload makes the daemon match its flags, environment
    and config file again; without ``live`` the old settings stand for the values in use."""
    in_use = {n: getattr(old, n) for n in RUNTIME} | dict(live or {})
    runtime = {n: getattr(new, n) for n in sorted(RUNTIME, key=list(Settings.model_fields).index)
               if in_use.get(n) != getattr(new, n)}
    return runtime, [n for n in Settings.model_fields if n not in RUNTIME and getattr(old, n) != getattr(new, n)]


STOP_WAIT_S = 65.0  # a stop waits this long for a reload under way (it gives the daemon 60 s to take settings)


class Reloader:
    """Owns the settings as last loaded; ``request()`` (from a signal handler) reloads them on a thread of its own."""

    def __init__(self, flags: Mapping[str, Any], config: str | Path | None, loaded: Loaded, daemon: Configurable,
                 set_level: Callable[[str], None]) -> None:
        self.flags, self.daemon, self.set_level = dict(flags), daemon, set_level
        # the file read at start, named: once it is gone, a reload fails (and changes nothing) rather than fall
        # back to no file at all, which would put every setting the file held back to its default
        self.config = config if config not in (None, "") else loaded.config.path
        self.current = loaded.settings
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.state: dict[str, Any] = {"file": str(loaded.config.path) if loaded.config.path else None,
                                      "reloads": 0, "last_reload_at": None, "last_error": None,
                                      "needs_restart": []}

    def request(self) -> None:
        """Safe to call from a signal handler: it only sets an event (a thread started beforehand does the work;
        starting a thread here could deadlock on threading's own lock, held by the interrupted code)."""
        if self._stopping:
            return
        self._wanted.set()
        if self._thread is None:  # not started (a direct call outside serve): reload on this thread
            self._wanted.clear()
            self.reload()

    def start(self) -> None:
        """Start the thread that reloads on ``request()``."""
        def loop() -> None:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._stopping:
                    return
                try:
                    self.reload()
                except Exception:  # noqa: BLE001 - a reload never takes the daemon down; said in the log
                    log.exception("reload failed", extra={"event": "config_reload_failed"})
        self._thread = threading.Thread(target=loop, name="reload", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = STOP_WAIT_S) -> bool:
        """No reload from now on; wait up to ``timeout`` s for one under way (it may be adding a source: the
        daemon's stop closes LMDB after it). False: one is still running."""
        self._stopping = True
        self._wanted.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def reload(self) -> dict[str, Any]:
        """Load the settings again and apply what changed; returns what happened (also logged)."""
        with self._lock:
            at, n = time.time(), self.state["reloads"] + 1
            try:
                loaded = load(self.flags, self.config)
            except ConfigError as e:  # the state changes in one step: /v1/status never shows half a reload
                self.state.update(last_reload_at=at, reloads=n, last_error=str(e))
                log.error("reload failed, still running on the settings in use: %s", e,
                          extra={"event": "config_reload_failed"})
                return {"applied": {}, "needs_restart": [], "error": str(e)}
            for warning in table_traps(loaded.config):
                log.warning("%s", warning, extra={"event": "config_key_in_table"})
            runtime, restart = changes(self.current, loaded.settings, self.daemon.runtime_config())
            error = self._apply(runtime, loaded.settings)
            applied = {} if error else runtime
            if applied:
                self.current = self.current.model_copy(update=applied)
            self.state.update(file=str(loaded.config.path) if loaded.config.path else None, last_reload_at=at,
                              reloads=n, last_error=error, needs_restart=restart)
            log.log(logging.ERROR if error else logging.INFO,
                    "reloaded settings%s: %s%s%s", f" from {loaded.config.path}" if loaded.config.path else "",
                    ", ".join(f"{n} = {_show(v)}" for n, v in applied.items())
                    or "no run-time setting changed",
                    f"; not applied: {error}" if error else "",
                    f"; these need a restart to change: {', '.join(restart)}" if restart else "",
                    extra={"event": "config_reloaded"})
            return {"applied": applied, "needs_restart": restart, "error": error}

    def _apply(self, runtime: dict[str, Any], new: Settings) -> str | None:
        """Apply ``runtime`` (all or nothing for the daemon's part; the sources first, as a whole, from ``new``);
        the error that refused it, or None."""
        if SOURCES & set(runtime):
            try:
                self.daemon.set_sources(new.named_sources(), new.source_filters())
            except (Invalid, Conflict) as e:
                return str(e)
        kw = {DAEMON_RUNTIME[n]: (int(v) if n in ("max_bytes", "min_free_disk", "max_ingest_rate") else v)
              for n, v in runtime.items() if n in DAEMON_RUNTIME}
        if kw:
            try:
                self.daemon.configure(**kw).result(timeout=60)
            except (Invalid, Conflict) as e:
                return str(e)
            except FutureTimeout:
                return "the daemon did not take the new settings within 60 s"
        if "log_level" in runtime:
            self.set_level(runtime["log_level"])
        return None


def _show(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)
