"""Owning a cache dir: one daemon per dir, a dir holds one source's sample in one record format."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from samplecache.format.constants import CACHE_ID_KEY
from samplecache.format.record import FORMAT_VERSION
from samplecache_service.config.mapsize import map_size_for as map_size_for  # for the daemon and benchmarks
from samplecache_service.config.redact import redact
from samplecache_service.config.settings import DEFAULT_SOURCE, Settings
from samplecache_service.files import FILE_MODE, fix_mode
from samplecache_service.store.catalog import Catalog, source_key
from samplecache_service.store.lmdbmeta import MetaError, read_meta
from samplecache_service.store.writer import Writer

log = logging.getLogger("samplecache.daemon")

COMMITTED = "lmdb.committed"  # beside the LMDB dir: the cache has committed data (written after the first commit)
RESET_HINT = "restart with --reset-cache to rebuild the cache (the cached sample is dropped)"


class StartupError(Exception):
    """The daemon cannot start; the message says which setting to change."""


class DamagedCacheFile(StartupError):
    """The cache's LMDB data file is damaged (``check_lmdb_file``): serve exits 2."""


def lock_cache_dir(cache_dir: Path) -> int:
    """One daemon per cache dir: a second one would hand out the same shard ids. The kernel drops the lock
    when the process dies, even by SIGKILL. Returns the locked file descriptor."""
    fd = os.open(cache_dir / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fix_mode(fd, FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"cache_dir {cache_dir} is in use by another samplecache daemon "
                           f"(it holds {cache_dir / 'daemon.lock'})") from None
    except OSError:
        os.close(fd)
        raise
    return fd


def check_identity(catalog: Catalog, writer: Writer, settings: Settings) -> str:
    """The cache dir holds this source's sample in this record format (or nothing yet: it is stamped).
    Returns the cache's id (``CACHE_ID_KEY``), made once when a cache (or an older one without it) is first
    opened: every manifest names it, so a reader never reads shard ids from another cache at the same path."""
    fmt = catalog.meta("format")
    if fmt is not None and fmt != FORMAT_VERSION:
        raise StartupError(f"cache_dir {settings.cache_dir} holds record format v{fmt}; this "
                           f"samplecache writes v{FORMAT_VERSION}: {RESET_HINT}, or use a new --cache-dir")
    src = catalog.meta("source")
    stamp: dict[str, Any] = {}
    if src is not None and settings.source and src != settings.source:
        # a cache that holds nothing of its source (a first start that failed) is not bound to it
        if holds_data(catalog):
            raise StartupError(f"cache_dir {settings.cache_dir} holds a sample of {redact(src)!r}, not of "
                               f"--source {redact(settings.source)!r}: use another --cache-dir, or {RESET_HINT}")
        log.info("cache_dir %s held nothing of %r: it now holds a sample of --source %r", settings.cache_dir,
                 redact(src), redact(settings.source), extra={"event": "cache_rebound"})
        stamp.update(source=settings.source)
    if fmt is None or src is None:
        stamp.update(format=FORMAT_VERSION, source=settings.source)
    cache_id = catalog.meta(CACHE_ID_KEY)
    if not cache_id:
        cache_id = stamp[CACHE_ID_KEY] = uuid.uuid4().hex
    if stamp:
        writer.put_meta(stamp).result()
    mark_committed(settings.lmdb_path)
    return str(cache_id)


def check_sources(catalog: Catalog, writer: Writer, urls: dict[str, str]) -> None:
    """Each named source still names the URL whose sample the cache holds for it; a name given a new URL
    while its old sample is resident is a StartupError (the default source is ``check_identity``'s)."""
    resident = catalog.resident_sources()
    stamp: dict[str, Any] = {}
    for name, url in urls.items():
        if name == DEFAULT_SOURCE:
            continue
        key = source_key(name, "url")
        was = catalog.meta(key)
        if was is not None and was != url and name in resident:
            raise StartupError(f"cache_dir holds a sample of {redact(was)!r} as source {name!r}, not of "
                               f"{redact(url)!r}: name the new URL another source (the old one's shards go once "
                               f"no lease holds them), or {RESET_HINT}")
        if was != url:
            stamp[key] = url
    if stamp:
        writer.put_meta(stamp).result()


def holds_data(catalog: Catalog) -> bool:
    """Whether the cache holds anything learnt from its source: shards, sealed epochs, a schema or file records."""
    return bool(catalog.shard_count() or catalog.epochs() or catalog.meta("schema") or catalog.files())


def committed_marker(lmdb_dir: Path) -> Path:
    return lmdb_dir.parent / COMMITTED


def mark_committed(lmdb_dir: Path) -> None:
    """Note beside the LMDB dir that it holds committed data, so a lost or emptied data file is not taken
    for a fresh cache. Written once (O_EXCL, never through a link), 0640."""
    marker = committed_marker(lmdb_dir)
    if marker.exists():
        return
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o640)
        json.dump({"format": FORMAT_VERSION, "data": str(lmdb_dir / "data.mdb"), "since": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())


def check_lmdb_file(path: Path) -> None:
    """Before ``lmdb.open``: raise DamagedCacheFile (a StartupError; one line naming the file and the way
    out) when the cache's LMDB data file is damaged: missing or empty while the dir holds other state
    (lock.mdb, or the marker ``mark_committed`` writes), shorter than its meta pages say, or with a wrong
    magic, version or meta page. ``path`` is the LMDB dir (``settings.lmdb_path``) or its ``data.mdb``.
    A fresh dir passes. The file is only read, never mapped: no SIGBUS."""
    lmdb_dir = path.parent if path.name == "data.mdb" else path
    data = lmdb_dir / "data.mdb"
    state = [p.name for p in (lmdb_dir / "lock.mdb", committed_marker(lmdb_dir)) if p.exists()]
    try:
        size = data.stat().st_size
    except FileNotFoundError:
        if committed_marker(lmdb_dir).exists():
            raise DamagedCacheFile(f"cache file {data} is missing but the cache dir held data ({COMMITTED} "
                                   f"is there): {RESET_HINT}") from None
        return
    if size == 0:
        if state:
            raise DamagedCacheFile(f"cache file {data} is empty (0 bytes) but the cache dir holds "
                                   f"{' and '.join(state)}: {RESET_HINT}")
        return
    try:
        read_meta(data)
    except MetaError as e:
        raise DamagedCacheFile(f"cache file {data} is damaged: {e}: {RESET_HINT}") from None
    except OSError as e:
        raise DamagedCacheFile(f"cache file {data} cannot be read: {e}") from None


def reset_cache(settings: Settings) -> None:
    """What --reset-cache does (hold the cache dir's lock first): drop the LMDB dir, its marker and what the
    staging dir holds. The cache dir, the staging dir itself, the lock and any token file stay."""
    shutil.rmtree(settings.lmdb_path, ignore_errors=True)
    committed_marker(settings.lmdb_path).unlink(missing_ok=True)
    if settings.staging_dir.is_dir():
        for p in settings.staging_dir.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
