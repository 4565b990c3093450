"""A clock the test sets by hand, for the parts that take one (leases, jobs, pacing, the scheduler)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
