"""Opening the cache's LMDB map, or saying in one line why this machine cannot hold it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import lmdb

from samplecache_service.config.mapsize import largest_map, map_size_for, too_large
from samplecache_service.store.cachedir import StartupError
from samplecache_service.store.writer import open_env


class BadSetting(StartupError):
    """A setting this machine cannot honour (a budget whose LMDB map does not fit): serve exits 2, as for an
    invalid setting."""


def open_cache_env(lmdb_dir: Path, max_bytes: int) -> tuple[lmdb.Environment, dict[bytes, Any]]:
    """``open_env`` with the map of ``max_bytes``. A map that this machine or filesystem cannot hold raises
    BadSetting naming the largest budget that works, found by opening LMDB maps beside the cache in a scratch dir:
    what LMDB itself accepts there, not an estimate."""
    try:
        return open_env(lmdb_dir, map_size_for(max_bytes))
    except (lmdb.MemoryError, OverflowError) as e:
        error = f"{type(e).__name__}: {e}"
    with tempfile.TemporaryDirectory(prefix=".map-probe-", dir=lmdb_dir.parent) as scratch:
        largest = largest_map(lambda size: _maps(scratch, size))
    raise BadSetting(f"{too_large(max_bytes, largest)} (LMDB said {error})")


def _maps(scratch: str, size: int) -> bool:
    try:
        lmdb.open(scratch, map_size=size, subdir=True, lock=False).close()
    except (lmdb.Error, OverflowError):
        return False
    return True
