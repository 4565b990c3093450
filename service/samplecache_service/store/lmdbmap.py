"""Opening the cache's LMDB environment and its map, or saying in one line why this machine cannot hold it."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import lmdb

from samplecache.format.constants import MAX_READERS
from samplecache_service.config.mapsize import largest_map, map_size_for, too_large
from samplecache_service.files import SHARED_FILE_MODE, make_dir, set_mode
from samplecache_service.store.cachedir import StartupError
from samplecache_service.store.catalog import DBS

log = logging.getLogger("samplecache.lmdbmap")


def open_env(path: Path, map_size: int) -> tuple[lmdb.Environment, dict[bytes, Any]]:
    """Open (or create) the cache environment and its named databases. The dir is 0750 and LMDB's two files
    0660 whatever the umask (and whatever an older version left)."""
    make_dir(path)
    # metasync=False: the meta page is flushed with the next commit's data sync; a killed daemon loses
    # nothing (the page cache has it) and a power cut rolls back at most the last commit, consistently.
    env = lmdb.open(str(path), map_size=map_size, max_dbs=len(DBS) + 2, max_readers=MAX_READERS,
                    subdir=True, meminit=False, readahead=False, metasync=False, mode=SHARED_FILE_MODE)
    # LMDB's mode passes through the umask (022 makes 0640): a reader only in the group could not take its slot
    for name in ("data.mdb", "lock.mdb"):
        try:
            set_mode(path / name, SHARED_FILE_MODE)
        except PermissionError as e:  # another user's file: the daemon still works, readers may not
            log.warning("cannot make %s mode %o (%s): trainers only in its group cannot read the cache",
                        path / name, SHARED_FILE_MODE, e.strerror, extra={"event": "file_mode", "path": str(path)})
    env.reader_check()  # clear slots of readers that died
    dbs = {name: env.open_db(name) for name in DBS}
    return env, dbs


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
