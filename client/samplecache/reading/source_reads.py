"""A mixture's reads per source, counted for its lease's reports: a heartbeat (every ttl/3 s) carries the count so
far, the release the exact one. A count costs ~0.3 ms, 2-3% of a short epoch when it came every 16k samples, so it
comes at most once a second."""

from __future__ import annotations

import time

from samplecache.api.lease import LeaseKeeper
from samplecache.reading.ordering.mixture import MixedOrder
from samplecache.reading.ordering.stream import Stream

COUNT_EVERY_S = 1.0
COUNT_EVERY = 16384  # samples, at least, between two counts


class SourceReads:
    """The reads per source of one stream of a mixture's epoch, told to ``keeper.read_sources``."""

    def __init__(self, order: MixedOrder, stream: Stream, keeper: LeaseKeeper) -> None:
        self.order, self.stream, self.keeper = order, stream, keeper
        self.counted = 0  # stream positions counted so far
        self.at = time.monotonic()
        self.by_source: dict[str, int] = {}

    def read(self, done: int) -> None:
        """``done`` positions of the stream were read: counted when enough were, since a count long enough ago."""
        if done - self.counted >= COUNT_EVERY and time.monotonic() - self.at >= COUNT_EVERY_S:
            self.count(done)

    def count(self, done: int) -> None:
        """Count the reads up to ``done`` now (the epoch's end: the release reports them exactly)."""
        if done <= self.counted:
            return
        for name, k in self.order.source_counts(self.stream.global_ranges(self.counted, done)).items():
            self.by_source[name] = self.by_source.get(name, 0) + k
        self.counted, self.at = done, time.monotonic()
        self.keeper.read_sources = dict(self.by_source)


__all__ = ["COUNT_EVERY", "COUNT_EVERY_S", "SourceReads"]
