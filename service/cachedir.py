"""Owning a cache dir: one daemon per dir, a dir holds one source's sample in one record format."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from samplecache.record import FORMAT_VERSION
from samplecache.service.catalog import Catalog
from samplecache.service.settings import Settings
from samplecache.service.writer import Writer


class StartupError(Exception):
    """The daemon cannot start; the message says which setting to change."""


def map_size_for(max_bytes: int) -> int:
    """LMDB map size from the budget: the budget, room for freed pages still held by old readers, and
    for raising the budget at runtime (up to twice). Only address space: the file grows as pages are used."""
    return int(max_bytes) * 4 + (1 << 30)


def lock_cache_dir(cache_dir: Path) -> int:
    """One daemon per cache dir: a second one would hand out the same shard ids. The kernel drops the lock
    when the process dies, even by SIGKILL. Returns the locked file descriptor."""
    fd = os.open(cache_dir / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"cache_dir {cache_dir} is in use by another samplecache daemon "
                           f"(it holds {cache_dir / 'daemon.lock'})") from None
    return fd


def check_identity(catalog: Catalog, writer: Writer, settings: Settings) -> None:
    """The cache dir holds this source's sample in this record format (or nothing yet: it is stamped)."""
    fmt = catalog.meta("format")
    if fmt is not None and fmt != FORMAT_VERSION:
        raise StartupError(f"cache_dir {settings.cache_dir} holds record format v{fmt}; this "
                           f"samplecache writes v{FORMAT_VERSION}: use a new --cache-dir")
    src = catalog.meta("source")
    if src is not None and settings.source and src != settings.source:
        raise StartupError(f"cache_dir {settings.cache_dir} holds a sample of {src!r}, not of "
                           f"--source {settings.source!r}: use another --cache-dir")
    if fmt is None or src is None:
        writer.put_meta({"format": FORMAT_VERSION, "source": settings.source}).result()
