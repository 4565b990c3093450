"""Health: supervised background threads, and what ``/healthz`` says about them.

Every background thread of the daemon runs its work through ``Health.run_loop``: an unexpected exception is
logged with its traceback, counted and shown in ``/healthz`` (503 with the reason) and ``/v1/status``; the work
is retried with a backoff and the problem clears when it succeeds again. A thread that keeps failing for
``fatal_after`` seconds (or stops beating) is fatal: ``on_fatal`` is called once so the process can exit
non-zero and its service manager restart it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from samplecache_service.config.redact import redact

log = logging.getLogger("samplecache.health")

STALL_S = 120.0  # a thread that has not beaten for this long is stalled (a listing of a slow remote may take a while)


@dataclass
class ThreadHealth:
    name: str
    failures: int = 0           # unexpected exceptions since start
    failing_since: float | None = None
    last_error: str | None = None
    last_beat: float = field(default_factory=time.monotonic)
    stopped: bool = False       # ended on purpose (shutdown)


class Health:
    def __init__(self, fatal_after: float = 60.0, on_fatal: Callable[[str], None] | None = None) -> None:
        self.fatal_after = fatal_after
        self.on_fatal = on_fatal
        self.fatal: str | None = None
        self._threads: dict[str, ThreadHealth] = {}
        self._lock = threading.Lock()
        self._checks: dict[str, Callable[[], str | None]] = {}

    # -- registration ---------------------------------------------------------------------------
    def thread(self, name: str) -> ThreadHealth:
        with self._lock:
            return self._threads.setdefault(name, ThreadHealth(name))

    def add_check(self, name: str, check: Callable[[], str | None]) -> None:
        """``check()`` returns a problem in words, or None when fine (e.g. the writer thread is alive)."""
        self._checks[name] = check

    # -- reporting from threads -------------------------------------------------------------------
    def beat(self, name: str) -> None:
        t = self.thread(name)
        t.last_beat = time.monotonic()
        if t.failing_since is not None:
            log.info("%s recovered after %d failure(s)", name, t.failures, extra={"event": "thread_recovered"})
            t.failing_since = None

    def failed(self, name: str, exc: BaseException) -> None:
        t = self.thread(name)
        t.failures += 1
        # shown in /healthz and /v1/status: an error about a remote path may hold the source's credentials
        t.last_error = redact(f"{type(exc).__name__}: {exc}")
        now = time.monotonic()
        if t.failing_since is None:
            t.failing_since = now
        log.error("%s thread failed (%d so far): %s", name, t.failures, t.last_error, exc_info=exc,
                  extra={"event": "thread_failed"})
        if now - t.failing_since >= self.fatal_after:
            self.die(f"{name} has failed for {now - t.failing_since:.0f}s: {t.last_error}")

    def die(self, reason: str) -> None:
        """The daemon cannot go on: record why and ask the process to exit non-zero (once)."""
        with self._lock:
            if self.fatal is not None:
                return
            self.fatal = reason
        log.critical("fatal: %s; exiting so the service manager restarts the daemon", reason,
                     extra={"event": "daemon_fatal"})
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def run_loop(self, name: str, step: Callable[[], None], stop: threading.Event, interval: float,
                 backoff: float = 1.0) -> None:
        """Call ``step`` until ``stop`` is set, supervised (see the module doc). Never raises."""
        self.thread(name)
        while not stop.is_set():
            try:
                step()
            except Exception as e:  # supervised: logged, counted, shown in /healthz, retried
                self.failed(name, e)
                stop.wait(backoff)
                continue
            self.beat(name)
            stop.wait(interval)
        self.thread(name).stopped = True

    # -- reading ---------------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """What is wrong now, in words (empty when healthy)."""
        out = [f"fatal: {self.fatal}"] if self.fatal else []
        now = time.monotonic()
        with self._lock:
            threads = list(self._threads.values())
        for t in threads:
            if t.stopped:
                continue
            if t.failing_since is not None:
                out.append(f"{t.name} thread failing for {now - t.failing_since:.0f}s: {t.last_error}")
            elif now - t.last_beat > STALL_S:
                out.append(f"{t.name} thread stalled: no progress for {now - t.last_beat:.0f}s")
        for name, check in list(self._checks.items()):
            try:
                got = check()
            except Exception as e:  # a check that fails is itself a problem
                got = f"{type(e).__name__}: {e}"
            if got:
                out.append(f"{name}: {got}")
        return [redact(p) for p in out]

    def snapshot(self) -> dict[str, dict[str, object]]:
        with self._lock:
            return {t.name: {"failures": t.failures, "failing": t.failing_since is not None,
                             "last_error": t.last_error} for t in self._threads.values()}
