"""The one place that spawns and supervises subprocesses: the sampler pool.

Workers are ``spawn``-context processes, each with its own pipe. A task's
outcome always comes back as a value: a worker that dies mid-task is reported
as a failed result and replaced. A worker says it is ready once its imports are
done; one that dies before that failed to start and is started again with a
backoff (``respawn.py``), so a broken install is a visible crash loop, never a
tight respawn loop. Stopping is polite first, then terminate -> kill -> join.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from samplecache_service.remote.stores import ErrorKind
from samplecache_service.sampling.respawn import DEFAULT_POLICY, Respawn, RespawnPolicy
from samplecache_service.sampling.sampler import SampleResult, SampleTask, run_task

log = logging.getLogger("samplecache.supervisor")

READY = "ready"  # a worker's first message: its target (and so pyarrow) imported, it takes tasks
# deaths by these signals come from outside (an operator, the OOM killer, a test): a sampler killed before it was
# ready is replaced at once, as any killed one; a start failure is an exit (an ImportError exits 1) or a crash
KILLED = (-signal.SIGKILL, -signal.SIGTERM)


def _die_with_parent() -> None:
    try:  # Linux: a SIGKILLed daemon must not leave samplers behind
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(conn: Connection, parent_pid: int, target: Callable[[Any], Any]) -> None:
    # Ctrl-C and SIGTERM (to the whole process group, as systemd and `docker stop` send it) are the daemon's to
    # handle: it stops its samplers itself, and a sampler that died of the signal is not a failure to report
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    if os.getppid() != parent_pid:
        return
    try:
        conn.send(READY)
    except (OSError, BrokenPipeError):
        return
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        conn.send(target(task))


class _Worker:
    def __init__(self, ctx: Any, target: Callable[[Any], Any]) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, os.getpid(), target),
                                daemon=True, name="samplecache-sampler")
        self.proc.start()
        child.close()
        self.task: SampleTask | None = None
        self.ready = False


class Supervisor:
    """A pool of sampler processes fed from a queue; results go to ``on_result``."""

    def __init__(self, workers: int, on_result: Callable[[SampleResult], None],
                 target: Callable[[SampleTask], SampleResult] = run_task,
                 respawn: RespawnPolicy = DEFAULT_POLICY, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = max(1, workers)
        self.on_result = on_result
        self.target = target
        self._ctx = mp.get_context("spawn")
        self._queue: collections.deque[SampleTask] = collections.deque()
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.restarts = 0
        self.failure: str | None = None  # why the pool's thread ended, if it did
        # a crash loop is every slot failing at start, twice: one bad moment of a large pool (each of 16 samplers
        # failing once together) is not one
        self.respawn = Respawn(dataclasses.replace(respawn, loop_failures=max(respawn.loop_failures, 2 * self.size)))
        self.clock = clock
        self._due: list[float] = []  # when to start a worker in each empty slot (after a start failure)

    def start(self) -> None:
        for _ in range(self.size):
            self._spawn()
        self._thread = threading.Thread(target=self._loop, name="samplecache-supervisor", daemon=True)
        self._thread.start()

    def submit(self, task: SampleTask) -> None:
        with self._lock:
            self._queue.append(task)

    def pending(self) -> int:
        """Tasks queued or running."""
        with self._lock:
            return len(self._queue) + sum(w.task is not None for w in self._workers)

    def running(self) -> list[SampleTask]:
        with self._lock:
            return [w.task for w in self._workers if w.task is not None]

    def _dispatch(self) -> None:
        with self._lock:
            for w in self._workers:
                if w.ready and w.task is None and self._queue and w.proc.is_alive():
                    w.task = self._queue.popleft()
                    try:
                        w.conn.send(w.task)
                    except (OSError, BrokenPipeError):
                        pass  # noticed below through the sentinel

    def stopping(self) -> None:
        """Shutdown has begun: a sampler that dies from now on is not replaced (nor reported)."""
        self._stopping.set()

    def problem(self) -> str | None:
        """What keeps the pool from sampling, for /healthz (None when fine)."""
        if self._stopping.is_set() or self._thread is None:
            return None
        if not self._thread.is_alive():
            return f"the sampler pool's thread has ended: {self.failure or 'unknown reason'}"
        return self.crash_loop()

    def crash_loop(self) -> str | None:
        """Why samplers keep failing to start (None when they start): /healthz, /v1/status and /metrics show it."""
        return self.respawn.crash_loop()

    @property
    def start_failures(self) -> int:
        return self.respawn.start_failures

    def _spawn(self) -> None:
        """Start a worker in an empty slot; a failure to start is retried with a backoff."""
        try:
            w = _Worker(self._ctx, self.target)
        except OSError as e:  # out of memory or processes
            self._start_failed(f"cannot start a sampler process: {type(e).__name__}: {e}")
            return
        with self._lock:
            self._workers.append(w)

    def _start_failed(self, error: str) -> None:
        delay, began = self.respawn.failed(self.clock(), error)
        with self._lock:
            self._due.append(self.clock() + delay)
        log.error("%s; starting another in %.2fs", error, delay, extra={"event": "sampler_start_failed"})
        if began:
            log.critical("crash loop: %s", self.crash_loop(), extra={"event": "sampler_crash_loop"})

    def _respawn_due(self) -> None:
        if self._stopping.is_set():
            return
        now = self.clock()
        with self._lock:
            due = [t for t in self._due if t <= now]
            self._due = [t for t in self._due if t > now]
        for _ in due:
            self._spawn()

    def _ready(self, w: _Worker) -> None:
        w.ready = True
        failures = self.respawn.in_a_row
        if failures:  # starts work again: the slots still waiting out a backoff start now
            with self._lock:
                self._due = [min(t, self.clock()) for t in self._due]
        if self.respawn.started():
            log.warning("a sampler process started cleanly after %d start failures: the crash loop is over",
                        failures, extra={"event": "sampler_crash_loop_ended"})

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # reported by problem() through /healthz
            self.failure = f"{type(e).__name__}: {e}"
            log.exception("the sampler pool's thread failed", extra={"event": "sampler_pool_failed"})
            raise

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._respawn_due()
            self._dispatch()
            with self._lock:
                workers = list(self._workers)
            by_conn = {w.conn: w for w in workers}
            by_sentinel = {w.proc.sentinel: w for w in workers}
            if not workers:  # every slot waits out its backoff
                self._stop.wait(0.1)
                continue
            ready = wait(list(by_conn) + list(by_sentinel), timeout=0.1)
            for r in ready:
                if r in by_conn:
                    try:
                        self._receive(by_conn[r])
                    except (EOFError, OSError):
                        continue  # the sentinel will report the death
            for r in ready:
                if r in by_sentinel and not self._stop.is_set() and not self._stopping.is_set():
                    self._replace(by_sentinel[r])

    def _receive(self, w: _Worker) -> None:
        message = w.conn.recv()
        if isinstance(message, str) and message == READY:
            self._ready(w)
            return
        with self._lock:
            w.task = None
        self._deliver(message)

    def _deliver(self, result: SampleResult) -> None:
        try:
            self.on_result(result)
        except Exception:  # a bad callback must not kill the pool
            log.exception("result handler failed", extra={"event": "result_handler_failed"})

    def _replace(self, dead: _Worker) -> None:
        # what it sent before it died (ready, a result) counts: read it first
        try:
            while dead.conn.poll():
                self._receive(dead)
        except (EOFError, OSError):
            pass
        dead.proc.join(timeout=1)
        code = dead.proc.exitcode
        dead.conn.close()
        with self._lock:
            task, dead.task = dead.task, None
            self._workers.remove(dead)
            self.restarts += 1
        if not dead.ready and code not in KILLED:  # it never took a task: nothing to report but the failure
            self._start_failed(f"a sampler process exited with code {code} before it was ready (its traceback is "
                               "on the daemon's stderr)")
            return
        self._spawn()
        log.warning("sampler process died (exit code %s); replaced", code, extra={
            "event": "sampler_died", "path": task.path if task else None, "unit": task.row_group if task else None})
        if task is not None:
            self._deliver(SampleResult(task=task, ok=False, error_kind=ErrorKind.TRANSIENT,
                                       error=f"sampler process died with exit code {code}"))

    def stop(self, timeout: float = 5.0) -> list[SampleTask]:
        """Stop every worker; returns tasks that were queued or running (not finished)."""
        self._stopping.set()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self._lock:
            unfinished = list(self._queue) + [w.task for w in self._workers if w.task is not None]
            self._queue.clear()
            self._due.clear()
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + timeout
        for w in self._workers:
            w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for w in self._workers:
            if w.proc.is_alive():  # busy with a long task (SIGTERM is ignored by samplers): kill it
                w.proc.kill()
                w.proc.join()
            w.conn.close()
        self._workers = []
        return unfinished
