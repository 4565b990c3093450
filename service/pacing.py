"""Pacing: how fast the daemon may fetch from the remote store.

While the cache is below its budget it fills as fast as the samplers go. Once a
new unit would need an eviction, replacing old samples is tied to training: each
sealed epoch allows ``replace_per_epoch`` x budget more remote bytes, so a full
cache that nobody reads fetches nothing, and a read cache turns over a known
share per epoch. ``max_ingest_rate`` (bytes/s, 0: none) caps the remote traffic
at all times. Units are charged an estimate when they are sent to a sampler and
settled with the bytes really fetched when they come back, so the remote bytes
per epoch keep to the share on average; a unit larger than one epoch's share
waits for a whole share.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class Pacer:
    def __init__(self, mode: str, replace_per_epoch: float, max_rate: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.mode, self.replace_per_epoch, self.max_rate = mode, float(replace_per_epoch), int(max_rate)
        self.clock = clock
        self.allowance = 0.0  # remote bytes still allowed for replacing, granted by sealed epochs
        self._tokens = float(max_rate)  # the bucket starts full
        self._refilled = clock()
        self._lock = threading.Lock()
        self.reason: str | None = None
        self._ratio = 1.0  # remote bytes fetched per uncompressed byte, learned from finished units

    def configure(self, mode: str | None = None, replace_per_epoch: float | None = None,
                  max_rate: int | None = None) -> None:
        with self._lock:
            if mode is not None:
                self.mode = mode
            if replace_per_epoch is not None:
                self.replace_per_epoch = float(replace_per_epoch)
            if max_rate is not None:
                self.max_rate = int(max_rate)

    def epoch_sealed(self, max_bytes: int) -> None:
        """A new epoch was sealed: allow one more share of replacement (at most one budget banked)."""
        with self._lock:
            share = self.replace_per_epoch * max_bytes
            self.allowance = min(self.allowance + share, max(share, float(max_bytes)))

    def _refill(self, unit: int) -> float:
        """Tokens of the rate limit now; the bucket holds one second of traffic (or one unit)."""
        now = self.clock()
        cap = max(float(self.max_rate), float(unit))
        self._tokens = min(cap, self._tokens + (now - self._refilled) * self.max_rate)
        self._refilled = now
        return cap

    def estimate(self, uncompressed: int) -> int:
        """Remote bytes a unit of ``uncompressed`` bytes (the footer's figure) is expected to fetch: scaled
        by what finished units really fetched per uncompressed byte."""
        return max(1, int(uncompressed * self._ratio))

    def why_wait(self, remote: int, rolling: bool, max_bytes: int) -> str | None:
        """Why a unit estimated at ``remote`` bytes may not be fetched now (None: it may). ``rolling``: it
        would need an eviction (the budget is full), so it counts against the epoch's share."""
        with self._lock:
            self.reason = self._why(remote, rolling, max_bytes)
            return self.reason

    def _why(self, remote: int, rolling: bool, max_bytes: int) -> str | None:
        if self.max_rate > 0:
            cap = self._refill(remote)
            if self._tokens < min(remote, cap):
                return f"max_ingest_rate: at most {self.max_rate} bytes/s from the remote"
        if self.mode == "off" or not rolling:
            return None  # not paced, or filling: the budget has room
        share = self.replace_per_epoch * max_bytes
        if share <= 0:
            return "cache full and replace_per_epoch is 0: the cached sample is kept as it is"
        if self.allowance >= min(remote, share):
            return None
        return (f"cache full: replacing at most {self.replace_per_epoch:g} x budget ({int(share)} bytes) per "
                f"sealed epoch; this epoch's share is used, waiting for the next epoch")

    def charge(self, remote: int, rolling: bool) -> None:
        with self._lock:
            self._tokens -= remote
            if rolling and self.mode != "off":
                self.allowance -= remote

    def settle(self, estimate: int, actual: int, rolling: bool, uncompressed: int) -> None:
        """Correct a charged estimate with the bytes the sampler really fetched."""
        with self._lock:
            self._tokens += estimate - actual
            if rolling and self.mode != "off":
                self.allowance += estimate - actual
            if actual > 0 and uncompressed > 0:
                self._ratio = 0.8 * self._ratio + 0.2 * min(4.0, max(0.02, actual / uncompressed))
