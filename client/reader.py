"""Reading blocks from the local LMDB cache: read-only, opened lazily once per process.

The environment is reopened when ``os.getpid()`` changes (a forked DataLoader
worker must never use its parent's handle), read transactions last one span of
one shard, and ``MapResizedError`` is absorbed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import lmdb
import numpy as np

from samplecache.record import BlockView, Schema, record_key

MAX_READERS = 4096
_ENVS: dict[str, tuple[int, lmdb.Environment, Any]] = {}


class CacheNotVisible(RuntimeError):
    """The LMDB cache named by the manifest is not on this filesystem."""


def open_cache(path: str, map_size: int) -> tuple[lmdb.Environment, Any]:
    """This process's read-only handle on the cache at ``path`` (and its records db)."""
    pid = os.getpid()
    got = _ENVS.get(path)
    if got is not None:
        if got[0] == pid:
            return got[1], got[2]
        # Inherited across fork: never use the parent's handle. Closing it here is safe
        # (LMDB only clears reader slots of the calling pid) and lets the path be reopened.
        del _ENVS[path]
        got[1].close()
    if not (Path(path) / "data.mdb").exists():
        raise CacheNotVisible(
            f"the samplecache LMDB cache {path!r} is not visible from this process (pid {pid}): the client "
            f"must run on the daemon's host and see its --cache-dir (SAMPLECACHE_CACHE_DIR); in a container, "
            f"mount that directory at the same path")
    env = lmdb.open(path, readonly=True, lock=True, max_readers=MAX_READERS, max_dbs=8, subdir=True,
                    map_size=map_size, readahead=False)
    db = env.open_db(b"records", create=False)
    _ENVS[path] = (pid, env, db)
    return env, db


def _begin(env: lmdb.Environment) -> lmdb.Transaction:
    try:
        return env.begin(buffers=True)
    except lmdb.MapResizedError:
        env.set_mapsize(0)
        return env.begin(buffers=True)


class ShardReader:
    """Reads rows of one shard; a short read transaction per call."""

    def __init__(self, path: str, map_size: int, schema: Schema) -> None:
        self.path, self.map_size, self.schema = path, map_size, schema

    def rows(self, shard_id: int, rows_per_block: int, rows: np.ndarray, cols: Sequence[int]) -> Iterator[dict[str, Any]]:
        """Yield the given rows (shard-local indices), decoded to owned values."""
        env, db = open_cache(self.path, self.map_size)
        views: dict[int, BlockView] = {}
        with _begin(env) as txn:
            for r in rows.tolist():
                b, i = divmod(r, rows_per_block)
                view = views.get(b)
                if view is None:
                    buf = txn.get(record_key(shard_id, b), db=db)
                    if buf is None:
                        raise KeyError(f"shard {shard_id} block {b} is missing from the cache (evicted "
                                       f"while leased? the daemon's lease TTL may be too short)")
                    view = views[b] = BlockView(buf, self.schema)
                yield view.row(i, cols)
