"""Free space for new shards: the filesystem's free bytes plus the pages LMDB holds free inside its file.

The LMDB file never shrinks: evicting shards frees pages inside it, which later writes reuse. A free-disk
guard that counted only the filesystem would never clear after a budget cut on a full disk.
"""

from __future__ import annotations

import errno
import shutil
import time
from pathlib import Path
from typing import Any

import lmdb

from samplecache_service.store.envgate import EnvClosed, EnvGate

META_PAGES = 2


def lmdb_free_bytes(gate: EnvGate, dbs: dict[bytes, Any]) -> int:
    """Bytes of pages inside the LMDB file that no database uses (its freelist and never-touched tail): an estimate
    (a commit between the transaction's start and the map's stats shifts them by its pages)."""
    def free(txn: lmdb.Transaction) -> int:
        info, psize = gate.env.info(), int(gate.env.stat()["psize"])
        stats = [txn.stat()]
        for db in dbs.values():  # a loop, not a comprehension: an error's traceback would keep its closure's txn
            stats.append(txn.stat(db))
        used = sum(int(st["branch_pages"]) + int(st["leaf_pages"]) + int(st["overflow_pages"]) for st in stats)
        return max(0, int(info["last_pgno"]) + 1 - META_PAGES - used) * psize
    return gate.read(free)


class DiskSpace:
    """``free()``: bytes new shards can use, re-measured at most every ``every`` seconds."""

    def __init__(self, cache_dir: Path, gate: EnvGate, dbs: dict[bytes, Any], every: float = 1.0) -> None:
        """``gate``: the environment, read through it (HTTP handlers ask for ``free`` too)."""
        self.cache_dir, self.gate, self.dbs, self.every = cache_dir, gate, dbs, every
        self._at = -1e9
        self._free = 0
        self.fs_free = 0  # the filesystem's own free bytes (staging files need these; LMDB's free pages do not help)

    def free(self, fresh: bool = False) -> int:
        now = time.monotonic()
        if fresh or now - self._at >= self.every:
            self.fs_free = shutil.disk_usage(self.cache_dir).free
            self._free = self.fs_free + lmdb_free_bytes(self.gate, self.dbs)
            self._at = now
        return self._free

    def free_or_zero(self) -> int:
        """``free()`` for reports: 0 when it cannot be measured (a missing cache dir shows in /healthz; a closing
        environment: the daemon stops)."""
        try:
            return self.free()
        except (OSError, EnvClosed):
            return 0


def out_of_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a write that failed for want of space (LMDB reports one as a commit I/O error)."""
    return isinstance(exc, (lmdb.MapFullError, lmdb.DiskError)) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        isinstance(exc, lmdb.Error) and any(w in str(exc) for w in ("Input/output", "No space", "quota")))
