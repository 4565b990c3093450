"""When to start a sampler again after one failed to start, and when that has become a crash loop.

A sampler that dies before it is ready (a broken install: ``import pyarrow`` fails in every new process) would
otherwise be respawned at once, for ever. Each start failure in a row doubles the wait before the next start (capped);
``CRASH_LOOP_FAILURES`` of them within ``CRASH_LOOP_WINDOW_S`` is a crash loop, shown in /healthz, /v1/status,
/metrics and the log. One sampler that starts cleanly ends both. Pure bookkeeping: the caller passes the time.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

FIRST_DELAY_S = 0.5         # the wait after the first start failure in a row
MAX_DELAY_S = 30.0          # the cap: a fixed install is picked up within this
CRASH_LOOP_FAILURES = 5     # start failures in a row, within the window, that make a crash loop
CRASH_LOOP_WINDOW_S = 60.0  # sporadic failures (an OOM kill a day) never add up to one


@dataclass(frozen=True)
class RespawnPolicy:
    first_delay: float = FIRST_DELAY_S
    max_delay: float = MAX_DELAY_S
    loop_failures: int = CRASH_LOOP_FAILURES
    loop_window: float = CRASH_LOOP_WINDOW_S


DEFAULT_POLICY = RespawnPolicy()

class Respawn:
    """Start failures since the last clean start: the next start's delay and the crash-loop state."""

    def __init__(self, policy: RespawnPolicy = DEFAULT_POLICY) -> None:
        self.policy = policy
        self.start_failures = 0  # since the daemon started (a counter for /metrics)
        self.in_a_row = 0  # since the last clean start
        self.last_error: str | None = None
        self.looping_since: float | None = None
        self._recent: collections.deque[float] = collections.deque()

    def failed(self, now: float, error: str) -> tuple[float, bool]:
        """A sampler failed to start: returns (seconds to wait before the next start, whether a crash loop began)."""
        self.start_failures += 1
        self.in_a_row += 1
        self.last_error = error
        self._recent.append(now)
        while self._recent and now - self._recent[0] > self.policy.loop_window:
            self._recent.popleft()
        began = self.looping_since is None and len(self._recent) >= self.policy.loop_failures
        if began:
            self.looping_since = now
        delay = min(self.policy.max_delay, self.policy.first_delay * 2 ** min(self.in_a_row - 1, 32))
        return delay, began

    def started(self) -> bool:
        """A sampler started cleanly: the backoff and the crash loop end. Returns whether a crash loop ended."""
        ended = self.looping_since is not None
        self.in_a_row = 0
        self.looping_since = None
        self._recent.clear()
        return ended

    def crash_loop(self) -> str | None:
        """The crash loop in words (None when there is none)."""
        if self.looping_since is None:
            return None
        return (f"sampler processes crash at start ({self.in_a_row} start failures in a row; restarting with "
                f"backoff): {self.last_error}")
