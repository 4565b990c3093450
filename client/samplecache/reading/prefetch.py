"""Background prefetch for in-process reading: a thread runs ahead of the consumer.

numpy releases the GIL while it gathers and copies, so the next chunk is read
while the training step runs. Errors travel to the consumer and are raised
there; closing the consumer's generator stops the thread (at once: a producer
waiting to put its item finds room).
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any, Iterator, TypeVar

T = TypeVar("T")
_DONE = object()


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


def _listed(items: Iterator[T]) -> list[Any]:
    """The items, and the error that stopped them (as a ``_Failure``) after them."""
    got: list[Any] = []
    try:
        for x in items:
            got.append(x)
    except Exception as e:  # noqa: BLE001 - handed to the consumer after the items made before it
        got.append(_Failure(e))
    return got


def prefetched_groups(groups: Iterator[Iterator[T]], depth: int = 2) -> Iterator[T]:
    """The items of ``groups``: the first group made in the caller's thread (an epoch's first batch waits for no
    thread), the others by a thread up to ``depth`` groups ahead, each handed over whole (one hand-over per group,
    not per item). An error while making a group reaches the consumer after that group's items made before it."""
    lists = (_listed(g) for g in groups)
    first = next(lists, None)
    if first is None:
        return
    rest = prefetched(lists, depth)
    try:
        for items in itertools.chain([first], rest):
            for x in items:
                if isinstance(x, _Failure):
                    raise x.exc
                yield x
    finally:
        rest.close()  # type: ignore[attr-defined]  # the thread stops now, not when collected
