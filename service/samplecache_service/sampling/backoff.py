"""Units waiting out their backoff after a failure: exponential, capped and jittered, then handed back."""

from __future__ import annotations

import random
from typing import Callable, Generic, TypeVar

MAX_UNIT_BACKOFF = 300.0  # s: the longest wait before a failing unit is tried again
JITTER = (0.75, 1.25)  # each wait is multiplied by a random factor in this range: failed units do not move in step

P = TypeVar("P")


class Backoff(Generic[P]):
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._waiting: list[tuple[float, P]] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def defer(self, item: P, failures: int, base: float) -> float:
        """Hold ``item`` for ``base`` x 2^(failures - 1) seconds (at most ``MAX_UNIT_BACKOFF``), jittered; returns
        the wait."""
        delay = float(min(MAX_UNIT_BACKOFF, base * 2 ** max(0, failures - 1))) * random.uniform(*JITTER)
        self._waiting.append((self.clock() + delay, item))
        return delay

    def due(self) -> list[P]:
        """The items whose wait is over, in the order they were deferred; they leave the queue."""
        now = self.clock()
        ready = [item for at, item in self._waiting if at <= now]
        self._waiting = [(at, item) for at, item in self._waiting if at > now]
        return ready
