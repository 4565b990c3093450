"""The one place that spawns and supervises subprocesses: the sampler pool.

Workers are ``spawn``-context processes, each with its own pipe. A task's
outcome always comes back as a value: a worker that dies mid-task is reported
as a failed result and replaced. Stopping is polite first, then
terminate -> kill -> join.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from samplecache_service.remote.stores import ErrorKind
from samplecache_service.sampling.sampler import SampleResult, SampleTask, run_task

log = logging.getLogger("samplecache.supervisor")


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


class Supervisor:
    """A pool of sampler processes fed from a queue; results go to ``on_result``."""

    def __init__(self, workers: int, on_result: Callable[[SampleResult], None],
                 target: Callable[[SampleTask], SampleResult] = run_task) -> None:
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
        self.failure: str | None = None  # why the pool cannot run, if it cannot

    def start(self) -> None:
        self._workers = [_Worker(self._ctx, self.target) for _ in range(self.size)]
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
                if w.task is None and self._queue and w.proc.is_alive():
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
        return self.failure

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # reported by problem() through /healthz
            self.failure = f"{type(e).__name__}: {e}"
            log.exception("the sampler pool's thread failed", extra={"event": "sampler_pool_failed"})
            raise

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._dispatch()
            by_conn = {w.conn: w for w in self._workers}
            by_sentinel = {w.proc.sentinel: w for w in self._workers}
            ready = wait(list(by_conn) + list(by_sentinel), timeout=0.1)
            for r in ready:
                if r in by_conn:
                    w = by_conn[r]
                    try:
                        result = w.conn.recv()
                    except (EOFError, OSError):
                        continue  # the sentinel will report the death
                    with self._lock:
                        w.task = None
                    self._deliver(result)
            for r in ready:
                if r in by_sentinel and not self._stop.is_set() and not self._stopping.is_set():
                    self._replace(by_sentinel[r])

    def _deliver(self, result: SampleResult) -> None:
        try:
            self.on_result(result)
        except Exception:  # a bad callback must not kill the pool
            log.exception("result handler failed", extra={"event": "result_handler_failed"})

    def _replace(self, dead: _Worker) -> None:
        dead.proc.join(timeout=1)
        code = dead.proc.exitcode
        with self._lock:
            task, dead.task = dead.task, None
            idx = self._workers.index(dead)
            try:
                self._workers[idx] = _Worker(self._ctx, self.target)
                self.failure = None
            except OSError as e:  # out of memory or processes: try again on the next turn
                self.failure = f"cannot start a sampler process: {type(e).__name__}: {e}"
                log.error("%s", self.failure, extra={"event": "sampler_start_failed"})
            self.restarts += 1
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
