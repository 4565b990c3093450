"""Epochs: seal epoch N's manifest on first request; every later caller gets the same bytes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

from samplecache.record import FORMAT_VERSION
from samplecache.service.catalog import Catalog, Shard
from samplecache.service.writer import Writer


class EpochError(Exception):
    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


def build_manifest(epoch: int, shards: list[Shard], schema: dict[str, Any], lmdb_path: str,
                   map_size: int, seed: int, source: str, previous: int) -> dict[str, Any]:
    """The manifest of ``epoch``: every resident shard, in id (= age) order."""
    rows = sum(s.rows for s in shards)
    return {
        "epoch": epoch,
        "format_version": FORMAT_VERSION,
        "seed": seed,
        "source": source,
        "lmdb_path": lmdb_path,
        "map_size": map_size,
        "schema": schema,
        "sealed_at": time.time(),
        "samples": rows,
        "bytes": sum(s.bytes for s in shards),
        "new_samples": rows - previous,
        # [shard id, rows, bytes, rows per block]
        "shards": [[s.id, s.rows, s.bytes, s.rows_per_block] for s in shards],
    }


class EpochManager:
    def __init__(self, catalog: Catalog, writer: Writer, manifest_fields: Callable[[], dict[str, Any]],
                 wait_max: float) -> None:
        self.catalog = catalog
        self.writer = writer
        self.manifest_fields = manifest_fields
        self.wait_max = wait_max
        self._lock = asyncio.Lock()

    def last_sealed(self) -> int:
        eps = self.catalog.epochs()
        return eps[-1] if eps else -1

    async def manifest(self, epoch: int, min_samples: int = 1, timeout: float = 30.0) -> bytes:
        """The sealed manifest of ``epoch``; seals it now if it is the next one."""
        raw = self.catalog.manifest_bytes(epoch)
        if raw is not None:
            return raw
        last = self.last_sealed()
        if epoch > last + 1:
            raise EpochError(409, f"epoch {epoch} cannot be sealed yet: the last sealed epoch is {last}, "
                                  f"so the next one is {last + 1}")
        if epoch <= last:
            raise EpochError(404, f"epoch {epoch} was never sealed (epochs start at {self.catalog.epochs()[0]})")
        deadline = time.monotonic() + min(max(timeout, 0.0), self.wait_max)
        while self.catalog.resident_rows < min_samples:
            if time.monotonic() >= deadline:
                raise EpochError(503, f"epoch {epoch} needs at least {min_samples} samples; the cache holds "
                                      f"{self.catalog.resident_rows} so far (warming up): retry later",
                                 retry_after=2.0)
            await asyncio.sleep(0.05)
        async with self._lock:
            raw = self.catalog.manifest_bytes(epoch)
            if raw is not None:
                return raw
            if self.last_sealed() != epoch - 1:
                raise EpochError(409, f"epoch {epoch} cannot be sealed: the last sealed epoch is {self.last_sealed()}")
            previous = self._rows_of(epoch - 1)

            def build() -> dict[str, Any]:
                return build_manifest(epoch, self.catalog.shards(), previous=previous, **self.manifest_fields())

            return await asyncio.wrap_future(self.writer.seal(epoch, build))

    def _rows_of(self, epoch: int) -> int:
        raw = self.catalog.manifest_bytes(epoch) if epoch >= 0 else None
        if raw is None:
            return 0
        return int(json.loads(raw)["samples"])
