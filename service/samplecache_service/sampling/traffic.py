"""Remote traffic: the units out at the samplers, what they are expected to fetch and cache, and what was
fetched, in total and per epoch. The pacer (``pacing.py``) decides; this keeps the books it decides on."""

from __future__ import annotations

import threading
from typing import Callable, Mapping

from samplecache_service.config.settings import DEFAULT_SOURCE
from samplecache_service.sampling.pacing import Pacer
from samplecache_service.sampling.sampler import SampleResult


class Traffic:
    def __init__(self, pacer: Pacer, discovery_bytes: Callable[[], int]) -> None:
        self.pacer = pacer
        self._discovery_bytes = discovery_bytes  # footers read by discovery, in the daemon
        self._units = 0  # fetched by the samplers
        self._needed = 0  # column-chunk bytes the units that came back needed
        self._at_seal = 0  # the total when the latest epoch was sealed
        # task -> (remote estimate, cached estimate, rolling, source)
        self._out: dict[str, tuple[int, int, bool, str]] = {}
        self._lock = threading.Lock()

    def total(self) -> int:
        """Bytes fetched from the remote since start: sampled units and footers."""
        return self._units + self._discovery_bytes()

    def sampler_totals(self) -> tuple[int, int]:
        """(bytes the samplers fetched, bytes of the column chunks their units needed), since start."""
        with self._lock:
            return self._units, self._needed

    def amplification(self) -> dict[str, int | float | None]:
        """What the samplers fetched against the column-chunk bytes their units needed."""
        fetched, needed = self.sampler_totals()
        return {"sampler_bytes": fetched, "needed_bytes": needed,
                "read_amplification": round(fetched / needed, 4) if needed else None}

    def since_seal(self) -> int:
        return self.total() - self._at_seal

    def sealing(self) -> int:
        """An epoch is being sealed now: the bytes fetched since the one before (they go in its manifest)."""
        total = self.total()
        fetched, self._at_seal = total - self._at_seal, total
        return fetched

    def out_bytes(self, mine: Callable[[str], bool] | None = None) -> int:
        """Cached bytes expected from the units out at the samplers (``mine``: only those of the task keys it
        says are one source's)."""
        with self._lock:
            return sum(out[1] for key, out in self._out.items() if mine is None or mine(key))

    def admit(self, key: str, cached: int, committed: int, max_bytes: int,
              source: str = DEFAULT_SOURCE) -> str | None:
        """Send unit ``key`` of ``source`` (``cached``: its footer's size) if the pace allows; else why not.
        ``committed``: the source's bytes resident or on their way to the cache; ``max_bytes``: its share."""
        remote = self.pacer.estimate(cached)
        rolling = committed + max(cached, 1) > max_bytes  # it needs an eviction: it replaces old samples
        reason = self.pacer.why_wait(remote, cached, rolling, max_bytes, source)
        if reason is None:
            self.pacer.charge(remote, cached, rolling, source)
            with self._lock:
                self._out[key] = (remote, cached, rolling, source)
        return reason

    def returned(self, r: SampleResult) -> None:
        """A unit came back (staged or failed): settle its estimates with what it really fetched and holds."""
        with self._lock:
            remote, cached, rolling, source = self._out.pop(r.task.key, (0, 0, False, DEFAULT_SOURCE))
            self._units += r.remote_bytes
            self._needed += r.needed_bytes
        self.pacer.settle((remote, r.remote_bytes), (cached, r.bytes if r.ok else 0), rolling, source)

    def epoch_started(self, shares: Mapping[str, int]) -> None:
        """A new epoch (sealed, or a job's next epoch on the latest one): one more share of replacement for
        each source (name -> its share of the budget, in bytes)."""
        for source, max_bytes in shares.items():
            self.pacer.epoch_sealed(max_bytes, source)
