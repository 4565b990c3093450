"""An owner thread's inbox: other threads hand it work as events and, for a request, wait for the answer."""

from __future__ import annotations

import logging
import queue
from concurrent.futures import Future
from typing import Callable, TypeVar

T = TypeVar("T")
log = logging.getLogger("samplecache.daemon")


class Inbox:
    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.failed_events = 0  # events that raised (logged with their traceback; the others still run)

    def post(self, event: Callable[[], None]) -> None:
        """Run ``event`` on the owner's thread (from any thread)."""
        self._q.put(event)

    def call(self, fn: Callable[[], T]) -> "Future[T]":
        """Run ``fn`` on the owner's thread; its result (or exception) comes back in the future."""
        fut: Future[T] = Future()

        def event() -> None:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # handed to the caller
                    fut.set_exception(e)
        self.post(event)
        return fut

    def drain(self, timeout: float) -> None:
        """Run the events that arrive within ``timeout`` s (the owner's thread calls this)."""
        try:
            event = self._q.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            try:
                event()
            except Exception:  # one bad event must not stop the others
                self.failed_events += 1
                log.exception("an event of the scheduler failed (%d so far)", self.failed_events,
                              extra={"event": "scheduler_event_failed"})
            try:
                event = self._q.get_nowait()
            except queue.Empty:
                return
