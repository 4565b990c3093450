"""The cache dir under a running daemon: still the one it opened, or removed or replaced behind its back.

After ``rm -rf`` of the cache dir the daemon would go on writing seals, leases and shards into an unlinked
``data.mdb`` that no restart sees, and with the lock file gone a second daemon could start a new cache at the
same path. ``CacheGuard`` compares each path with what the daemon holds open (device and inode, and the link
count of an open file: 0 once unlinked); the daemon reports a mismatch in ``/healthz`` and exits so that its
service manager restarts it on the cache that is there now.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, NamedTuple

log = logging.getLogger("samplecache.cacheguard")

INTERVAL_S = 2.0  # how often the daemon looks; a mismatch seen twice in a row is fatal


class Held(NamedTuple):
    what: str  # in words, for the message
    path: Path
    fd: int | None  # an fd the daemon holds (None: only the identity seen at start is known)
    identity: tuple[int, int]  # (st_dev, st_ino) at start


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class CacheGuard:
    """What the daemon opened at start: the cache dir, LMDB's data and lock files, and the daemon's lock file."""

    def __init__(self, cache_dir: Path, lmdb_dir: Path, lock_fd: int) -> None:
        """Call after LMDB is open. ``lock_fd``: ``lock_cache_dir``'s fd (not closed here). The dir and
        ``data.mdb`` are opened read-only here; LMDB's ``lock.mdb`` only by its identity, since closing an fd of
        it would drop the POSIX locks LMDB holds on it."""
        dir_fd = os.open(cache_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            data_fd = os.open(lmdb_dir / "data.mdb", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(dir_fd)
            raise
        self._owned = [dir_fd, data_fd]
        self.held = [Held("cache dir", cache_dir, dir_fd, _identity(os.fstat(dir_fd))),
                     Held("LMDB data file", lmdb_dir / "data.mdb", data_fd, _identity(os.fstat(data_fd))),
                     Held("daemon lock file", cache_dir / "daemon.lock", lock_fd, _identity(os.fstat(lock_fd))),
                     Held("LMDB lock file", lmdb_dir / "lock.mdb", None, _identity(os.stat(lmdb_dir / "lock.mdb")))]
        self._seen: str | None = None

    def problem(self) -> str | None:
        """What was removed or replaced, in words, or None while every path is what the daemon holds."""
        for h in self.held:
            unlinked = h.fd is not None and os.fstat(h.fd).st_nlink == 0
            try:
                now: tuple[int, int] | None = _identity(os.stat(h.path))
            except (FileNotFoundError, NotADirectoryError):
                return self._message(h, "was removed")
            except OSError:  # the path cannot be looked at (permissions): the held file's link count still tells
                now = None
            if now is not None and now != h.identity:
                return self._message(h, "was replaced by another one")
            if unlinked:
                return self._message(h, "was removed")
        return None

    def watch(self, die: Callable[[str], None]) -> None:
        """One look (every ``INTERVAL_S``): a problem is logged when first seen and ``die``d on when seen again,
        so that ``/healthz`` answers 503 for a while before the process exits."""
        problem = self.problem()
        if problem is not None and self._seen is not None:
            die(problem)
        elif problem is not None:
            log.critical("%s", problem, extra={"event": "cache_dir_replaced"})
        self._seen = problem

    def close(self) -> None:
        for fd in self._owned:
            os.close(fd)
        self._owned = []

    @staticmethod
    def _message(h: Held, happened: str) -> str:
        return (f"the {h.what} {h.path} {happened} while the daemon ran: what it writes now would be lost and "
                f"readers would see another cache; the daemon exits to be restarted on the cache dir as it is now")
