"""Pacing: how fast the daemon may fetch from the remote store.

While the cache is below its budget it fills as fast as the samplers go. Once a
new unit would need an eviction, replacing old samples is tied to training: each
new epoch allows ``replace_per_epoch`` x budget of new cached bytes (what an
epoch leaves unused does not carry over), so a full cache that nobody reads
fetches nothing, and a read cache turns over a known share per epoch, the share
``epoch_headroom`` keeps free. ``max_ingest_rate`` (bytes/s, 0: none) caps the
remote traffic at all times. With several sources each has its own share of replacement, ``replace_per_epoch``
x its share of the budget, spent only by its units (a source that churns never uses another's); the rate cap
stays one for the host. Units are charged estimates when they are sent to a
sampler (the footer's size for the cache, scaled by what earlier units really
fetched for the remote) and settled with the real bytes when they come back, so
both keep to their limits on average; a unit larger than one epoch's share waits
for a whole share.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from samplecache_service.config.settings import DEFAULT_SOURCE


class Pacer:
    def __init__(self, mode: str, replace_per_epoch: float, max_rate: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.mode, self.replace_per_epoch, self.max_rate = mode, float(replace_per_epoch), int(max_rate)
        self.clock = clock
        self.allowances: dict[str, float] = {}  # source -> bytes it may still replace, granted by sealed epochs
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
            if max_rate is not None and int(max_rate) != self.max_rate:
                self.max_rate = int(max_rate)
                self._tokens, self._refilled = float(self.max_rate), self.clock()  # a new cap starts full

    @property
    def allowance(self) -> float:
        """Bytes every source together may still replace this epoch."""
        with self._lock:
            return sum(self.allowances.values())

    def epoch_sealed(self, max_bytes: int, source: str = DEFAULT_SOURCE) -> None:
        """A new epoch: ``source`` (of ``max_bytes``, its share of the budget) may replace one share more (what
        an earlier epoch left unused does not carry over, and an overshoot is paid back first)."""
        with self._lock:
            share = self.replace_per_epoch * max_bytes
            self.allowances[source] = min(self.allowances.get(source, 0.0) + share, share)

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

    def why_wait(self, remote: int, cached: int, rolling: bool, max_bytes: int,
                 source: str = DEFAULT_SOURCE) -> str | None:
        """Why a unit of ``source`` estimated at ``remote`` bytes from the remote and ``cached`` bytes in the
        cache may not be fetched now (None: it may). ``rolling``: it would need an eviction (``max_bytes``, the
        source's share of the budget, is full), so it counts against the source's share of the epoch."""
        with self._lock:
            self.reason = self._why(remote, cached, rolling, max_bytes, source)
            return self.reason

    def _why(self, remote: int, cached: int, rolling: bool, max_bytes: int, source: str) -> str | None:
        if self.max_rate > 0:
            cap = self._refill(remote)
            if self._tokens < min(remote, cap):
                return f"max_ingest_rate: at most {self.max_rate} bytes/s from the remote"
        if self.mode == "off" or not rolling:
            return None  # not paced, or filling: the budget has room
        share = self.replace_per_epoch * max_bytes
        if share <= 0:
            return "cache full and replace_per_epoch is 0: the cached sample is kept as it is"
        if self.allowances.get(source, 0.0) >= min(cached, share):
            return None
        return (f"cache full: replacing at most {self.replace_per_epoch:g} x budget ({int(share)} bytes) per "
                f"sealed epoch; this epoch's share is used, waiting for the next epoch")

    def charge(self, remote: int, cached: int, rolling: bool, source: str = DEFAULT_SOURCE) -> None:
        """A unit goes to a sampler: ``remote`` bytes (estimated) against the rate cap and, when it replaces
        old samples, ``cached`` bytes (the footer's size) against its source's share of the epoch."""
        with self._lock:
            if self.max_rate > 0:
                self._tokens -= remote
            if rolling and self.mode != "off":
                self.allowances[source] = self.allowances.get(source, 0.0) - cached

    def settle(self, remote: tuple[int, int], cached: tuple[int, int], rolling: bool,
               source: str = DEFAULT_SOURCE) -> None:
        """Correct the charged (estimate, actual) ``remote`` and ``cached`` bytes once the unit came back."""
        with self._lock:
            if self.max_rate > 0:
                self._tokens += remote[0] - remote[1]
            if rolling and self.mode != "off":
                self.allowances[source] = self.allowances.get(source, 0.0) + cached[0] - cached[1]
            if remote[1] > 0 and cached[0] > 0:
                self._ratio = 0.8 * self._ratio + 0.2 * min(4.0, max(0.02, remote[1] / cached[0]))
