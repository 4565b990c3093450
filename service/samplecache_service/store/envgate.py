"""The LMDB environment's users besides the writer thread (HTTP handlers reading a manifest or the map's usage),
counted, so that closing the environment waits for them: a transaction or ``env.info()`` on a closed environment
crashes the process (py-lmdb does not guard it), where a stop should only end it.

A read transaction must also be *gone* before its user leaves: py-lmdb keeps a finished read transaction's handle
(to reuse it) until the Python object dies, and a close that runs while another thread frees that object aborts the
handle twice (a segfault). So transactions are opened only by ``read``, which frees its transaction inside the gate;
``using`` is for the environment's own stats."""

from __future__ import annotations

import threading
import traceback
import weakref
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import lmdb

T = TypeVar("T")


class EnvClosed(RuntimeError):
    """The environment is closing (the daemon stops): nothing more is read from it."""


class EnvGate:
    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self._cond = threading.Condition()
        self._users = 0
        self._closing = False
        self.kept: list[lmdb.Transaction] = []  # transactions that outlived their read: freed after the close

    @contextmanager
    def using(self) -> Iterator[lmdb.Environment]:
        """The environment, for its stats (``info()``, ``stat()``) within the block; a transaction goes through
        ``read``."""
        with self._cond:
            if self._closing:
                raise EnvClosed("the cache is closing: the daemon is stopping")
            self._users += 1
        try:
            yield self.env
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()

    def read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """``fn(txn)`` in a read transaction that is aborted and freed before this user leaves the gate. ``fn`` must
        not keep ``txn`` (or a cursor of it) past its return; one still referenced then (by an error's traceback,
        through a closure) is kept by the gate until the close, so that its death cannot race it."""
        with self.using() as env:
            txn: lmdb.Transaction | None = None
            try:
                txn = env.begin()
                return fn(txn)
            except BaseException as e:
                _clear_frames(e)  # fn's frames, kept by the traceback, would hold txn
                raise
            finally:
                if txn is not None:
                    try:
                        txn.abort()
                    finally:
                        left = weakref.ref(txn)
                        del txn  # the only reference left, as a rule: freed here, inside the gate
                        escaped = left()
                        if escaped is not None:
                            with self._cond:
                                self.kept.append(escaped)

    def close(self, timeout: float, others_done: bool = True) -> bool:
        """Let no new user in, wait up to ``timeout`` s for those inside, then close the environment; False (left
        open: the process's exit frees it) when one is still inside, or when not ``others_done`` (a thread that
        writes or reads it outside this gate did not end)."""
        with self._cond:
            self._closing = True
            idle = self._cond.wait_for(lambda: self._users == 0, timeout)
        if idle and others_done:
            self.env.close()
            self.kept.clear()  # closed with the environment: nothing left for their death to abort
            return True
        return False


def _clear_frames(e: BaseException) -> None:
    """Drop the locals of the finished frames of ``e``'s traceback and of the errors it chains."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        traceback.clear_frames(x.__traceback__)
        todo += [x.__cause__, x.__context__]


__all__ = ["EnvClosed", "EnvGate"]
