"""The remote store: any fsspec URL of Parquet files, read one row group at a time."""

from __future__ import annotations

import glob as _glob
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
OPEN_BLOCK_SIZE = 1 << 20  # s3fs defaults to 50 MiB: a footer read would fetch far too much


def count_fetched(f: Any, count: Callable[[int], None]) -> Any:
    """Have ``count(n)`` called with the bytes the open fsspec file ``f`` really fetches: a buffered remote
    file's block fetches (read-ahead included), else the bytes of each read."""
    if getattr(f, "_samplecache_counted", False):
        return f  # an fsspec that hands out the same object again (memory://): counted already
    f._samplecache_counted = True
    cache = getattr(f, "cache", None)
    fetch = getattr(cache, "fetcher", None)
    if fetch is not None:
        def fetcher(start: int, end: int) -> bytes:
            out = fetch(start, end)
            count(len(out))
            return out  # type: ignore[no-any-return]
        cache.fetcher = fetcher  # type: ignore[union-attr]
        return f
    read = f.read

    def counted_read(*args: Any) -> bytes:
        out = read(*args)
        count(len(out))
        return out  # type: ignore[no-any-return]
    f.read = counted_read
    return f


class RemoteError(Exception):
    """The remote cannot be listed or opened (bad URL, unreachable, no Parquet files)."""


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int
    row_groups: tuple[int, ...]  # rows per row group
    row_group_bytes: tuple[int, ...] = ()  # uncompressed bytes per row group (the footer's estimate)


class RemoteStore(Protocol):
    url: str

    def list_files(self) -> list[str]: ...
    def file_info(self, path: str) -> tuple[FileInfo, pa.Schema]: ...
    def read_row_group(self, path: str, row_group: int, columns: Sequence[str] | None) -> pa.Table: ...


class FsspecRemote:
    """A prefix, directory or glob of Parquet files behind an fsspec URL."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except (ValueError, ImportError, TypeError) as e:
            raise RemoteError(f"cannot use source {url!r}: {e}") from e
        self.bytes_read = 0  # bytes fetched from the remote by this object (footers and row groups)
        self._count_lock = threading.Lock()

    def _count(self, n: int) -> None:
        with self._count_lock:
            self.bytes_read += n

    def _open(self, path: str, **kwargs: Any) -> Any:
        return count_fetched(self.fs.open(path, "rb", block_size=OPEN_BLOCK_SIZE, **kwargs), self._count)

    def list_files(self) -> list[str]:
        try:
            if _glob.has_magic(self.root):
                found = self.fs.glob(self.root)
            elif self.fs.isdir(self.root):
                found = self.fs.find(self.root)
            elif self.fs.exists(self.root):
                found = [self.root]
            else:
                raise RemoteError(f"source {self.url!r} does not exist")
        except RemoteError:
            raise
        except Exception as e:  # network, credentials, permissions: all surface the same way
            raise RemoteError(f"cannot list source {self.url!r}: {type(e).__name__}: {e}") from e
        files = sorted(p for p in found if p.lower().endswith(PARQUET_SUFFIXES))
        if not files:
            raise RemoteError(f"no Parquet files (*.parquet, *.parq, *.pq) under source {self.url!r}")
        return files

    def file_info(self, path: str) -> tuple[FileInfo, pa.Schema]:
        with self._open(path) as f:
            pf = pq.ParquetFile(f)
            md = pf.metadata
            rgs = [md.row_group(i) for i in range(md.num_row_groups)]
            info = FileInfo(path=path, size=int(getattr(f, "size", 0) or 0),
                            row_groups=tuple(rg.num_rows for rg in rgs),
                            row_group_bytes=tuple(rg.total_byte_size for rg in rgs))
            return info, pf.schema_arrow

    def read_row_group(self, path: str, row_group: int, columns: Sequence[str] | None) -> pa.Table:
        # No read-ahead cache: pyarrow asks for the row group's column chunks (coalesced by pre_buffer), so the
        # remote sends those bytes and not a block beyond them (2.06x -> 1.06x for 1 MiB row groups on S3)
        with self._open(path, cache_type="none") as f:
            return pq.ParquetFile(f, pre_buffer=True).read_row_group(row_group, columns=list(columns) if columns else None)


def classify_error(exc: BaseException) -> str:
    """'unreachable' (retry, never blame the file), 'transient' (retry, then quarantine) or 'corrupt'."""
    name = type(exc).__name__
    text = str(exc)
    if isinstance(exc, (ConnectionError, TimeoutError)) or any(
            w in name for w in ("Connect", "Timeout", "EndpointConnection")):
        return "unreachable"
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, EOFError)):
        return "corrupt"
    if isinstance(exc, OSError):
        if any(w in text for w in ("thrift", "magic", "Parquet", "parquet", "Unexpected end")):
            return "corrupt"
        return "transient"
    return "corrupt"
