"""The remote store: any fsspec URL of Parquet files, read one row group at a time."""

from __future__ import annotations

import collections
import errno
import glob as _glob
import struct
import threading
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from samplecache_service.config.redact import redact
from samplecache_service.remote.partitions import hive_values

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
OPEN_BLOCK_SIZE = 1 << 20  # s3fs defaults to 50 MiB: a footer read would fetch far too much
STREAM_BUFFER = 8 << 20  # a large unit is read through a buffer of this size per column, not pre-buffered whole
FOOTERS_KEPT = 256  # footers a process keeps (a 10,000 row group footer is ~3 MB)
FOOTER_GUESS = 64 << 10  # the tail read for a footer of unknown length (one more read when it is longer)
MAGIC = b"PAR1"
NO_RANGES = "this server does not support HTTP Range requests"


def arrow_schema(md: pq.FileMetaData) -> pa.Schema:
    """The Arrow schema a file's row groups are read with. ``md.schema.to_arrow_schema()`` is not it: it gives a
    Parquet UUID / JSON column as fixed_size_binary(16) / string, where pyarrow's readers give arrow.uuid /
    arrow.json. A ParquetFile given the footer reads no byte of its (empty) source."""
    return pq.ParquetFile(pa.BufferReader(b""), metadata=md).schema_arrow


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


def skipped_files(others: Sequence[str], root: str, shown: int = 5) -> str:
    """``N other file(s) skipped: a, b, ...``: the files a listing found that are not Parquet, named relative to
    the source's root (and masked), the first ``shown`` of them."""
    names = [redact(p[len(root):].lstrip("/") if p.startswith(root) else p) for p in others[:shown]]
    return f"{len(others)} other file(s) skipped: {', '.join(names)}" + (", ..." if len(others) > shown else "")


def s3_endpoint(fs: Any) -> str | None:
    """The endpoint s3fs resolved (its options, else AWS_ENDPOINT_URL or the profile, as botocore reads them), so
    a table's reader (delta-rs, pyiceberg) talks to the same S3 as the samplers; None where it cannot be asked."""
    try:
        given = getattr(fs, "endpoint_url", None) or (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
        if given:
            return str(given)
        fs.connect()
        resolved = str(fs.s3.meta.endpoint_url)
        # AWS itself: the readers find the bucket's regional endpoint on their own
        return None if resolved.endswith(".amazonaws.com") else resolved
    except Exception:  # noqa: BLE001 - not s3fs, or no client: the readers then read the environment
        return None


class RemoteError(Exception):
    """The remote cannot be listed or opened (bad URL, unreachable, no Parquet files)."""


class TableRefused(RemoteError):
    """The source's table uses a feature the daemon cannot serve exactly (deletion vectors, column mapping,
    merge-on-read deletes): served as is, it would give rows the table no longer holds."""


class RangeUnsupported(RemoteError):
    """The server answered a ranged read with the whole file: row groups cannot be read from it."""


@dataclass(frozen=True)
class Footer:
    """What a file's footer says (and its size): read once per file by discovery."""

    path: str
    size: int
    row_groups: tuple[int, ...]  # rows per row group
    row_group_bytes: tuple[int, ...] = ()  # uncompressed bytes per row group (the footer's estimate)
    footer: int = 0  # bytes of the serialized footer (its length word and magic not included)


class RemoteStore(Protocol):
    url: str

    def list_files(self) -> list[str]: ...
    def file_info(self, path: str) -> tuple[Footer, pa.Schema]: ...
    def read_row_group(self, path: str, row_group: int, columns: Sequence[str] | None) -> pa.Table: ...
    def partitions(self, path: str) -> dict[str, str | None]: ...


class FsspecRemote:
    """A prefix, directory or glob of Parquet files behind an fsspec URL."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 table_version: int | None = None, table_as_of: datetime | None = None,
                 catalogs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """``catalogs``: the Iceberg catalogs an ``iceberg://CATALOG/NS.TABLE`` URL may name (name -> pyiceberg
        properties); such a source's files are where the catalog says the table lies (``data_url``)."""
        self.url = url
        self.storage_options = dict(storage_options or {})
        # a table source's pinned version, or the one it had at a time (neither: follow the newest)
        self.table_version, self.table_as_of = table_version, table_as_of
        # the table at the root (remote.tables), found by the first listing; None: a folder of Parquet files
        self.table: Any = None
        self._looked_for_table = False
        catalog = None
        self.data_url = url  # the fsspec URL of its files: what the samplers open
        try:
            if url.startswith("iceberg://"):
                # here, not in the module's imports: remote.iceberg builds on this module
                from samplecache_service.remote.iceberg import catalog_table

                catalog, self.data_url = catalog_table(url, catalogs or {}, self.storage_options)
            self.fs, self.root = fsspec.core.url_to_fs(self.data_url, **dict(storage_options or {}))
        except (ValueError, ImportError, TypeError) as e:
            raise RemoteError(f"cannot use source {url!r}: {e}") from e
        if catalog is not None:
            from samplecache_service.remote.iceberg import IcebergMetadata

            self.table = IcebergMetadata(self, table_version, table_as_of, catalog)
            self._looked_for_table = True
        self.bytes_read = 0  # bytes fetched from the remote by this object (footers and row groups)
        self._footers: collections.OrderedDict[tuple[str, int], pq.FileMetaData] = collections.OrderedDict()
        self._count_lock = threading.Lock()
        self.signatures: dict[str, str] = {}  # path -> size and ETag/mtime, as of the last listing
        self.sizes: dict[str, int] = {}  # path -> size, as of the last listing
        self.others: list[str] = []  # files of the last listing that are not Parquet (by name): skipped

    def _count(self, n: int) -> None:
        with self._count_lock:
            self.bytes_read += n

    def _open(self, path: str, **kwargs: Any) -> Any:
        return count_fetched(self.fs.open(path, "rb", block_size=OPEN_BLOCK_SIZE, **kwargs), self._count)

    @property
    def partition_schema(self) -> pa.Schema | None:
        """A table's partition columns as its own schema types them (None: a folder, or a table of none)."""
        return self.table.partition_schema if self.table is not None else None

    def list_files(self) -> list[str]:
        if not self._looked_for_table:
            # here, not in the module's imports: remote.tables builds on this module
            from samplecache_service.remote.tables import find_table

            self.fs.invalidate_cache()
            self.table, self._looked_for_table = find_table(self), True
        if self.table is not None:
            self.fs.invalidate_cache()
            return self.table.list_files(self)  # type: ignore[no-any-return]
        try:
            self.fs.invalidate_cache()  # a listing must see files that changed since the last one
            if _glob.has_magic(self.root):
                found = self.fs.glob(self.root, detail=True)
            elif self.fs.isdir(self.root):
                found = self.fs.find(self.root, detail=True)
            elif self.fs.exists(self.root):
                found = {self.root: self.fs.info(self.root)}
            else:
                raise RemoteError(f"source {self.url!r} does not exist")
        except RemoteError:
            raise
        except Exception as e:  # network, credentials, permissions: all surface the same way
            raise RemoteError(f"cannot list source {self.url!r}: {type(e).__name__}: {e}") from e
        files = sorted(p for p in found if p.lower().endswith(PARQUET_SUFFIXES))
        self.others = sorted(p for p, i in found.items() if not p.lower().endswith(PARQUET_SUFFIXES)
                             and not (isinstance(i, Mapping) and i.get("type") == "directory"))
        self.signatures = {p: signature(found[p]) for p in files if isinstance(found[p], Mapping)}
        self.sizes = {p: int(found[p]["size"]) for p in files
                      if isinstance(found[p], Mapping) and isinstance(found[p].get("size"), int)}
        if not files:
            raise RemoteError(f"no Parquet files (*.parquet, *.parq, *.pq) under source {self.url!r}"
                              + (f" ({skipped_files(self.others, self.root)})" if self.others else ""))
        return files

    def partitions(self, path: str) -> dict[str, str | None]:
        """The file's partition values: from its table's log, else from its Hive folders (``lang=en/``) below
        the source's root."""
        if self.table is not None:
            return self.table.partitions(path)  # type: ignore[no-any-return]
        return hive_values(path, self.root)

    def file_info(self, path: str) -> tuple[Footer, pa.Schema]:
        size = self.sizes.get(path) or int(self.fs.size(path))
        md = self._read_footer(path, size, 0)
        rgs = [md.row_group(i) for i in range(md.num_row_groups)]
        info = Footer(path=path, size=size, row_groups=tuple(rg.num_rows for rg in rgs),
                      row_group_bytes=tuple(rg.total_byte_size for rg in rgs), footer=md.serialized_size)
        return info, arrow_schema(md)

    def _cat(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``path``: one ranged read, counted. Raises RangeUnsupported when more came
        back (a plain HTTP server, ``python -m http.server``, answers 200 with the whole file): the file is fine,
        the source cannot serve row groups, so no file may be blamed for it."""
        data: bytes = self.fs.cat_file(path, start=start, end=end)
        self._count(len(data))
        if len(data) > end - start:
            raise RangeUnsupported(
                f"{redact(path)}: {NO_RANGES} (asked for bytes {start}-{end - 1}, got {len(data)} bytes): serve the "
                f"files from a server that answers Range with 206 Partial Content (nginx, S3, ...)")
        return data

    def _read_footer(self, path: str, size: int, length: int) -> pq.FileMetaData:
        """The footer from exactly its bytes at the file's end: one ranged read when its ``length`` is known
        (the daemon's discovery tells the samplers), else the last 64 KiB and, for a longer footer, the rest."""
        if size < 12:
            raise pa.ArrowInvalid(f"{path}: a Parquet file of {size} bytes is too short to hold a footer (corrupt)")
        # never the leading magic: a request for less than the whole file, so a server that ignores Range shows
        # itself by a longer answer (a file of at most FOOTER_GUESS bytes would otherwise be asked for whole)
        n = min(size - 4, length + 8 if length > 0 else FOOTER_GUESS)
        tail = self._cat(path, size - n, size)
        if len(tail) != n or tail[-4:] != MAGIC:
            raise pa.ArrowInvalid(f"{path}: Parquet magic bytes not found in footer: the file is corrupt, was cut "
                                  f"short, or is not Parquet")
        (got,) = struct.unpack("<I", tail[-8:-4])
        if got + 12 > size:
            raise pa.ArrowInvalid(f"{path}: invalid footer length {got} in a file of {size} bytes (corrupt)")
        if got + 8 > n:
            tail = self._cat(path, size - got - 8, size - n) + tail
        return pq.read_metadata(pa.BufferReader(MAGIC + tail[len(tail) - got - 8:]))

    def read_row_group(self, path: str, row_group: int, columns: Sequence[str] | None) -> pa.Table:
        # No read-ahead cache: pyarrow asks for the row group's column chunks (coalesced by pre_buffer), so the
        # remote sends those bytes and not a block beyond them (2.06x -> 1.06x for 1 MiB row groups on S3)
        with self._open(path, cache_type="none") as f:
            return pq.ParquetFile(f, pre_buffer=True).read_row_group(
                row_group, columns=list(columns) if columns else None)

    def footer(self, path: str, size: int = 0, length: int = 0) -> pq.FileMetaData:
        """The file's footer, read once per file version (its size) in this process: remote Parquet files do not
        change in place, and one that is replaced gets a new size or is set aside by discovery."""
        size = size or self.sizes.get(path) or int(self.fs.size(path))
        got = self._footers.get((path, size))
        if got is not None:
            self._footers.move_to_end((path, size))
            return got
        md = self._read_footer(path, size, length)
        self._footers[(path, size)] = md
        while len(self._footers) > FOOTERS_KEPT:
            self._footers.popitem(last=False)
        return md

    def current_size(self, path: str) -> int | None:
        """The file's size now, asked of the store (no listing cache); None when it is gone or cannot be asked."""
        try:
            self.fs.invalidate_cache(path)
            return int(self.fs.size(path))
        except Exception:  # noqa: BLE001 - a question about a failure: any answer but a size is "not known"
            return None

    def read_unit(self, path: str, first: int, count: int, columns: Sequence[str],
                  part_bytes: int, size: int = 0, footer: int = 0) -> Iterator[pa.Table]:
        """The rows of row groups ``[first, first + count)`` as tables of about ``part_bytes`` (decoded).

        A unit the footer says is small is read in one go (its column chunks fetched together); a larger one
        is streamed in record batches, so a sampler holds about two parts at a time, never the row group.
        Either way only the needed column chunks are fetched, each read exactly (no read-ahead block); ``size``
        and ``footer`` (the file's and its footer's lengths, when known) spare a HEAD request and a guess."""
        size = size or self.sizes.get(path, 0)
        md = self.footer(path, size, footer)
        have = set(md.schema.to_arrow_schema().names)
        cols = [c for c in columns if c in have]
        groups = list(range(first, first + count))
        rows = sum(md.row_group(g).num_rows for g in groups)
        est = sum(md.row_group(g).total_byte_size for g in groups)
        # a known size spares the HEAD request (fsspec's buffered files take it; the local one ignores it)
        with self._open(path, cache_type="none", **({"size": size} if size else {})) as f:
            if est <= part_bytes:
                # one thread: a sampler is one of many processes, and pyarrow's pool costs CPU (1.7 vs 2.9 ms/MB)
                table = pq.ParquetFile(f, metadata=md, pre_buffer=True).read_row_groups(groups, columns=cols,
                                                                                         use_threads=False)
                per_row = max(1, table.nbytes // max(1, table.num_rows))
                step = max(1, part_bytes // per_row)
                for a in range(0, max(1, table.num_rows), step):
                    yield table.slice(a, step)
                return
            pf = pq.ParquetFile(f, metadata=md, pre_buffer=False, buffer_size=STREAM_BUFFER)
            batch_rows = max(1, int(rows * part_bytes / max(1, est) / 4))
            pending: list[pa.RecordBatch] = []
            size = 0
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=cols, use_threads=False):
                pending.append(batch)
                size += batch.nbytes
                if size >= part_bytes:
                    yield pa.Table.from_batches(pending)
                    pending, size = [], 0
            if pending:
                yield pa.Table.from_batches(pending)


def chunk_bytes(md: pq.FileMetaData, groups: Sequence[int], columns: Sequence[str]) -> int:
    """Compressed bytes of the column chunks of ``columns`` in row groups ``groups``: what a unit needs to fetch
    (a nested column's leaves included; dictionary pages are part of their chunk)."""
    total = 0
    for g in groups:
        rg = md.row_group(g)
        for j in range(rg.num_columns):
            cc = rg.column(j)
            leaf = cc.path_in_schema
            if any(leaf == c or leaf.startswith(c + ".") for c in columns):
                total += cc.total_compressed_size
    return total


TRANSIENT_NAMES = ("Throttl", "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Credentials",
                   "AccessDenied", "Forbidden", "NoSuchKey", "NoSuchBucket", "ClientPayload", "ServerDisconnected",
                   "ResponseStreaming", "IncompleteRead", "ProtocolError", "ChunkedEncoding", "ClientError")
CORRUPT_TEXT = ("thrift", "magic bytes", "Unexpected end of stream", "Couldn't deserialize", "Corrupt",
                "corrupt", "Invalid", "invalid")


class ErrorKind(str, Enum):
    """Why reading a remote unit failed. The values are what the log's ``error_class``, the metrics' ``class``
    label, ``/v1/status`` and the quarantine list say."""

    TRANSIENT = "transient"
    UNREACHABLE = "unreachable"
    CORRUPT = "corrupt"
    SCHEMA = "schema"
    DISK = "disk"
    # replaced since it was listed: listed again at once, the unit retried as transient
    CHANGED = "changed"
    # sampled, but its staged shard could not be ingested (a damaged staging file, an LMDB error): sampled again
    INGEST = "ingest"

    def __str__(self) -> str:
        return self.value


def classify_error(exc: BaseException) -> ErrorKind:
    """Why a sampling task failed, by cause:

    - 'unreachable': the network or the store is down (retry later; never blame the file);
    - 'transient': permission, not found, throttling, local disk, memory, anything not known to be the file's
      bytes (retry that unit with a backoff; never quarantine);
    - 'disk': the local disk is full (sampling pauses until there is room);
    - 'schema': read fine, but its values do not fit the dataset's schema (quarantined as such);
    - 'corrupt': pyarrow could not parse the bytes it got (the only cause that may quarantine a file).
    """
    name = type(exc).__name__
    text = str(exc)
    # a server that ignores Range cannot serve any file: like a store that is down, never the file's fault
    # (fsspec's HTTP file says so in a ValueError when a read of a buffered file gets the whole body)
    if isinstance(exc, RangeUnsupported) or "support range requests" in text:
        return ErrorKind.UNREACHABLE
    if isinstance(exc, (ConnectionError, TimeoutError)) or any(
            w in name for w in ("Connect", "Timeout", "EndpointConnection")):
        return ErrorKind.UNREACHABLE
    if type(exc).__name__ == "SchemaConflict":
        return ErrorKind.SCHEMA  # its values do not fit the dataset's schema: the file is set aside as such
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ErrorKind.DISK  # the local disk is full (writing the staging file): pause, never blame the file
    if isinstance(exc, (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError, MemoryError,
                        InterruptedError, BlockingIOError)):
        return ErrorKind.TRANSIENT
    if isinstance(exc, OSError) and exc.errno is not None:
        return ErrorKind.TRANSIENT  # a system call failed (disk full, no such file, too many files): not the bytes
    if any(w in name for w in TRANSIENT_NAMES):
        return ErrorKind.TRANSIENT
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowNotImplementedError, EOFError)):
        return ErrorKind.CORRUPT
    if isinstance(exc, (OSError, pa.ArrowException)) and any(w in text for w in CORRUPT_TEXT):
        return ErrorKind.CORRUPT  # pyarrow reports unparsable Parquet as OSError("Couldn't deserialize thrift ...")
    return ErrorKind.TRANSIENT


def signature(info: Mapping[str, Any]) -> str:
    """What identifies one version of a remote file in a listing: its size and ETag (or mtime)."""
    tag = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") \
        or info.get("last_modified") or info.get("generation") or ""
    return f"{info.get('size')}:{str(tag).strip(chr(34))}"
