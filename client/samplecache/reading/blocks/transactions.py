"""This process's read transactions on the cache, and the remap after the daemon grew the map: LMDB remaps in
place, so a remap waits until no other thread of the process (a read-ahead thread) is inside a transaction."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator

import lmdb


class Gate:
    """The read transactions in flight in this process; ``remap`` waits until none is."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active = 0
        self.remapping = False

    def enter(self) -> None:
        with self.cond:
            while self.remapping:
                self.cond.wait()
            self.active += 1

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            if self.remapping and not self.active:
                self.cond.notify_all()

    def remap(self, env: lmdb.Environment) -> None:
        with self.cond:
            if self.remapping:  # another thread is at it: wait for it, then begin again
                while self.remapping:
                    self.cond.wait()
                return
            self.remapping = True
            while self.active:
                self.cond.wait()
            try:
                env.set_mapsize(0)
            finally:
                self.remapping = False
                self.cond.notify_all()


_GATE = Gate()
os.register_at_fork(after_in_child=lambda: globals().update(_GATE=Gate()))  # a child's threads are new


@contextmanager
def begin(env: lmdb.Environment) -> Iterator[lmdb.Transaction]:
    """A read transaction (after remapping when the daemon grew the map)."""
    while True:
        _GATE.enter()
        try:
            txn = env.begin(buffers=True)
        except lmdb.MapResizedError:
            _GATE.leave()
            _GATE.remap(env)
            continue
        try:
            with txn:
                yield txn
            return
        finally:
            _GATE.leave()


__all__ = ["Gate", "begin"]
