"""Reading ahead of the consumer in this process: one thread (``prefetched``) or several (``read_ahead``).

numpy releases the GIL while it gathers and copies (and LMDB while it looks a block up), so the next items are
read while the training step runs. Errors travel to the consumer and are raised there; closing the consumer's
generator stops the reading.

``read_ahead`` runs each item's work as one task on a small per-process pool of threads kept between epochs (no
thread is started per epoch) and hands the results out in order: with large batches on two cores, two groups of
batches are read at once, each by one thread from start to end, instead of every batch's copies being split over
threads that wait for each other (a hand-off per batch costs more than it saves when the cores are shared). A
task's copies run on its own thread (``gather.copy_inline``): the tasks are the parallelism.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

from samplecache.gather import MAX_THREADS, copy_inline

T = TypeVar("T")
_DONE = object()
_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked child makes its own


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def prefetched(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Yield ``items`` while a thread produces up to ``depth`` of them ahead."""
    if depth <= 0:
        yield from items
        return
    q: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as e:  # handed to the consumer
            q.put(_Failure(e))

    t = threading.Thread(target=run, name="samplecache-prefetch", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        try:  # a producer waiting to put its item finds room at once
            q.get_nowait()
        except queue.Empty:
            pass
        t.join(timeout=5)


def _pool() -> ThreadPoolExecutor:
    global _POOL
    pid = os.getpid()
    if _POOL is None or _POOL[0] != pid:  # never use a pool inherited across fork: its threads are gone
        _POOL = (pid, ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="samplecache-read", initializer=copy_inline))
    return _POOL[1]


def read_ahead(tasks: Iterator[Callable[[], T]], depth: int) -> Iterator[T]:
    """The results of ``tasks`` in order, up to ``depth`` of them handed to the read-ahead threads ahead of the
    consumer. A task no thread has started when the consumer needs it is run by the consumer itself (on a busy
    machine a thread may wait a whole time slice for a core: the consumer does not wait for that)."""
    pending: deque[tuple[Future[T], Callable[[], T]]] = deque()
    pool = _pool()

    def take() -> T:
        future, task = pending.popleft()
        return task() if future.cancel() else future.result()

    try:
        for task in tasks:
            pending.append((pool.submit(task), task))
            if len(pending) > depth:
                yield take()
        while pending:
            yield take()
    finally:
        for future, _ in pending:
            future.cancel()
        for future, _ in pending:  # those already running write into memory the caller may reuse: let them finish
            if not future.cancelled():
                try:
                    future.result(timeout=30)
                except BaseException:  # noqa: BLE001 (the consumer has stopped: nobody to tell)
                    pass
