"""Discovery: list the source, read new files' footers, unify their schemas, plan their units, quarantine bad ones."""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from samplecache.format.record import Schema
from samplecache_service.config.settings import DEFAULT_SOURCE
from samplecache_service.remote.columns import UnsupportedColumn, infer_schema
from samplecache_service.remote.filters import FilterError, parse_filter
from samplecache_service.remote.partitions import check_values, partition_types, with_partitions
from samplecache_service.remote.planner import plan_units
from samplecache_service.remote.schemas import (
    SchemaConflict,
    check_fits,
    from_text,
    load_schema_file,
    normalize,
    to_text,
    unify,
)
from samplecache_service.remote.stores import (
    ErrorKind,
    RemoteError,
    RemoteStore,
    TableRefused,
    classify_error,
    skipped_files,
)
from samplecache_service.store.catalog import Catalog, source_key
from samplecache_service.store.fileinfo import FileInfo
from samplecache_service.store.writer import Writer

log = logging.getLogger("samplecache.discovery")

FOOTER_THREADS = 8


def owner_of(remote: RemoteStore) -> Callable[[str], bool]:
    """Whether a listed path is one of ``remote``'s files: it is its root (one file) or lies under it, a folder
    boundary apart (``b/t`` owns ``b/t/x``, not ``b/t2/x``); a glob's: under its fixed part."""
    root = str(getattr(remote, "root", ""))
    prefix = re.split(r"[*?\[]", root)[0]
    if prefix != root:
        return lambda path: path.startswith(prefix)
    base = root.rstrip("/")
    return lambda path: path == base or path.startswith(base + "/")


class Discovery:
    def __init__(self, remote: RemoteStore, catalog: Catalog, writer: Writer, columns: list[str] | None,
                 unit_bytes: int = 64 << 20, schema_file: Path | None = None,
                 partition_filter: str | None = None, source: str = DEFAULT_SOURCE,
                 owns: Callable[[str], bool] | None = None) -> None:
        """``source``: the named source listed (its schema and table format are its own meta keys). ``owns``: which
        of the catalog's files are this source's (``owner_of``; None: all, the one source of a cache): a listing
        marks removed only files of its own that left its table or filter, never another source's."""
        self.remote, self.catalog, self.writer, self.columns = remote, catalog, writer, columns
        self.source, self.owns = source, owns
        # only files whose partition values match are sampled (FilterError at start when it is not a filter)
        self.filter = parse_filter(partition_filter) if partition_filter else None
        self.outside_filter = 0  # files of the last listing that the filter left out
        # their paths: this source never samples them, and no new epoch names its shards of them. Kept here, not as
        # FileInfo.removed, which every source of the cache reads: two sources can be filters of one table
        self.outside_files: frozenset[str] = frozenset()
        self._types: dict[str, pa.DataType] = {}  # partition columns' types, over the last listing
        self.unit_bytes = unit_bytes
        raw = catalog.meta(source_key(self.source, "schema"))
        self.schema: Schema | None = Schema.from_json(raw) if raw else None
        self.skipped: dict[str, str] = catalog.meta(source_key(self.source, "skipped_columns"), {}) or {}
        text = catalog.meta(source_key(self.source, "arrow_schema_ipc"))
        self.target: pa.Schema | None = from_text(text) if text else None  # the dataset's Arrow schema
        self._target_text: tuple[pa.Schema, str] | None = None
        # the last listing: its Parquet files, and the other files it skipped (README.txt, _SUCCESS, data.csv)
        self.parquet_files = 0
        self.others: list[str] = []
        self.listed_at: float | None = None
        self.removed_now = 0  # files the last listing found gone from the table (their shards are to be evicted)
        self.refused: str | None = None  # why the table's newest version cannot be served (a feature it took on)
        self.pinned = load_schema_file(schema_file) if schema_file else None
        if self.pinned is not None:
            lacking = [c for c in columns or () if c not in self.pinned.names]
            if lacking:
                raise SchemaConflict(f"--schema-file {schema_file} has no column {lacking}; it has "
                                     f"{self.pinned.names}")
            self.pinned = normalize(self.pinned, columns)
            if self.target is not None and not self.target.equals(self.pinned):
                raise SchemaConflict(f"--schema-file {schema_file} differs from the schema this cache dir was "
                                     f"built with; use a new --cache-dir")

    def target_text(self) -> str | None:
        """The dataset's Arrow schema as the sampling tasks carry it (serialized once per schema)."""
        if self.target is None:
            return None
        if self._target_text is None or self._target_text[0] is not self.target:
            self._target_text = (self.target, to_text(self.target))
        return self._target_text[1]

    def listing(self) -> dict[str, Any] | None:
        """What the last listing found, for /v1/status (None before the first one)."""
        if self.listed_at is None:
            return None
        root = str(getattr(self.remote, "root", ""))
        return {"parquet": self.parquet_files, "skipped": len(self.others), "listed_at": self.listed_at,
                "skipped_text": skipped_files(self.others, root) if self.others else "",
                "filter": self.filter.text if self.filter else None, "outside_filter": self.outside_filter}

    def prunes(self) -> bool:
        """Whether a listing can take cached files out of the dataset: the source is a table (as this cache knew
        it), or a filter is set."""
        return self.filter is not None or bool(self.catalog.meta(source_key(self.source, "table_format")))

    @property
    def is_table(self) -> bool:
        """Whether the source is a table (its log says which files are live), not a folder."""
        return getattr(self.remote, "table", None) is not None

    def table_info(self) -> dict[str, Any] | None:
        """The source's table as the last listing read it, for /v1/status (None: a folder, or not listed yet)."""
        table = getattr(self.remote, "table", None)
        if table is None:
            return None
        removed = sum(1 for i in self._known().values() if i.removed)
        return {**table.info(), "removed_files": removed}

    def _known(self) -> dict[str, FileInfo]:
        """The catalog's records of this source's files."""
        files = self.catalog.files()
        return files if self.owns is None else {p: i for p, i in files.items() if self.owns(p)}

    def run(self) -> list[str]:
        """List the source; record the new files (units or quarantine), and look again at quarantined files that
        changed (size/ETag/mtime) or were released by hand. Returns the paths whose units are new."""
        # what the catalog held before this listing: a file another source of the table records meanwhile (from a
        # newer version) is not taken for one that left the table
        before = self._known() if self.schema is not None else {}
        try:
            listed = self.remote.list_files()
        except TableRefused as e:
            self.refused = str(e)  # no epoch is sealed and nothing sampled until the table can be served again
            raise
        self.refused = None
        table = getattr(self.remote, "table", None)
        if table is not None and self.catalog.meta(source_key(self.source, "table_format")) != table.format:
            # a warm start waits for a listing
            self.writer.put_meta({source_key(self.source, "table_format"): table.format}).result()
        parts = {p: self.remote.partitions(p) for p in listed}
        self._types = self._partition_types(parts)
        paths = self._filtered(listed, parts)
        self.outside_files = frozenset(listed).difference(paths)  # before listed_at: ready() reads both
        others = list(getattr(self.remote, "others", []) or [])
        sigs: dict[str, str] = getattr(self.remote, "signatures", {}) or {}
        # before the dataset has a schema, every file is looked at again (a failed start decided nothing)
        known = {**before, **self._known()} if self.schema is not None else {}
        new = [p for p in paths if p not in known]
        if new or others != self.others:  # once per change: files that are not Parquet are skipped, and said so
            root = str(getattr(self.remote, "root", ""))
            log.info("source %s: %d Parquet file(s), %d new; %s", self.remote.url, len(paths), len(new),
                     skipped_files(others, root) if others else "no other files",
                     extra={"event": "files_discovered", "path": self.remote.url})
        self.parquet_files, self.others, self.listed_at = len(listed), others, time.time()
        # known files looked at again: a quarantined one released by hand, and any one that changed (replaced in
        # place: its footer, size and units are read anew, so that no sampler reads it at its old size)
        again = [p for p in paths if p in known and (known[p].quarantined and known[p].recheck or (
            sigs.get(p) and known[p].signature not in (None, sigs.get(p))))]
        self.removed_now = self._prune(listed, {p: known[p] for p in before})  # their newest records
        if not new and not again:
            return []
        seq = 1 + max((i.seq for i in self.catalog.files().values()), default=0)  # over every source's files
        with ThreadPoolExecutor(FOOTER_THREADS) as pool:
            footers = [f for f in pool.map(self._footer, sorted(new + again)) if f is not None]
        found = self._check_schemas(footers)
        fresh: list[str] = []
        for path, info in found.items():
            info = found[path] = replace(info, signature=sigs.get(path))
            old = known.get(path)
            if old is None:
                found[path] = replace(info, seq=seq)
                fresh.append(path)
            elif info.quarantined and old.quarantined:
                log.warning("%s is still unreadable after it changed or was released: %s", path, info.reason,
                            extra={"event": "quarantine_kept", "path": path, "error_class": info.kind})
                found[path] = replace(old, reason=info.reason, at=info.at, signature=info.signature, recheck=False)
            else:
                found[path] = replace(info, seq=old.seq)
                if not old.row_groups or old.units not in (None, info.units):
                    fresh.append(path)  # new units; any old ones are skipped as stale (planner.unit_current)
                if old.quarantined:
                    log.info("%s leaves quarantine (%s)", path, "released" if old.recheck else "it changed",
                             extra={"event": "quarantine_left", "path": path})
                elif not info.quarantined:
                    log.info("%s changed (%s bytes, now %s): its footer was read again", path, old.size,
                             info.size, extra={"event": "file_changed", "path": path})
        self.writer.put_files(found).result()
        if self.schema is None:
            reasons = sorted({i.reason for i in found.values() if i.quarantined})
            raise RemoteError(f"no readable Parquet file under source {self.remote.url!r}"
                              + (": " + "; ".join(reasons[:3]) if reasons else ""))
        return sorted(p for p in fresh if not found[p].quarantined or p in new)

    def _filtered(self, listed: list[str], parts: dict[str, dict[str, str | None]]) -> list[str]:
        """The listed files inside the filter (all without one): decided from the listing, so nothing of a file
        outside it is fetched."""
        if self.filter is None:
            return listed
        try:
            self.filter.check_columns(self._types)
            paths = [p for p in listed if self.filter.matches(parts[p], self._types)]
        except FilterError as e:
            raise RemoteError(f"source {self.remote.url!r}: {e}") from None
        self.outside_filter = len(listed) - len(paths)
        if not paths:
            raise RemoteError(f"no file of source {self.remote.url!r} is inside --filter {self.filter.text!r} "
                              f"({len(listed)} file(s) listed)")
        return paths

    def _prune(self, listed: list[str], known: dict[str, FileInfo]) -> int:
        """Files that left a table's version (overwrite, delete, optimize) marked removed, and any that came back
        (a restore) live again; returns how many left. A file missing from a folder's listing is not marked: that
        is a failure to read, not a change of the data. Files the filter leaves out stay live here (``outside_files``
        says so, for this source alone); one marked removed by an older version for its filter is live again."""
        table = getattr(self.remote, "table", None) is not None
        live = set(listed)
        gone = {p: replace(i, removed=True) for p, i in known.items() if table and p not in live and not i.removed}
        back = {p: replace(known[p], removed=False) for p in listed if p in known and known[p].removed}
        if gone or back:
            self.writer.put_files({**gone, **back}).result()
            log.info("source %s: %d file(s) left the table, %d came back; %d live", self.remote.url, len(gone),
                     len(back), len(listed), extra={"event": "table_files_removed", "path": self.remote.url})
        return len(gone)

    def _footer(self, path: str) -> tuple[str, FileInfo, pa.Schema | None] | None:
        """The file's units and schema; quarantined only when its footer bytes cannot be parsed; None (look
        again at the next listing) when reading it failed for any other cause."""
        try:
            footer, schema = self.remote.file_info(path)
            units = plan_units(footer.row_groups, footer.row_group_bytes, self.unit_bytes)
            return path, FileInfo(row_groups=footer.row_groups, row_group_bytes=footer.row_group_bytes,
                                  units=tuple((g, c, n) for g, c, n in units), size=footer.size,
                                  footer=footer.footer, partitions=self.remote.partitions(path)), schema
        except Exception as e:
            kind = classify_error(e)
            if kind == ErrorKind.UNREACHABLE:
                raise
            if kind != ErrorKind.CORRUPT:
                log.warning("cannot read the footer of %s (%s: %s); trying again at the next listing",
                            path, type(e).__name__, e,
                            extra={"event": "footer_unreadable", "path": path, "error_class": kind})
                return None
            log.warning("quarantined %s: unreadable footer: %s: %s", path, type(e).__name__, e,
                        extra={"event": "file_quarantined", "path": path, "error_class": ErrorKind.CORRUPT})
            return path, FileInfo().quarantine(f"unreadable footer: {type(e).__name__}: {e}", ErrorKind.CORRUPT), None

    def _check_schemas(self, footers: list[tuple[str, FileInfo, pa.Schema | None]]) -> dict[str, FileInfo]:
        """Each file checked against the dataset's schema (unified from these files while there is none)."""
        found: dict[str, FileInfo] = {}
        fixed = self.target if self.target is not None else self.pinned
        target = fixed
        names: dict[str, None] = {}  # the files' own columns (normalize keeps only the wanted ones), for errors
        fitting = 0  # files that fit: a pinned schema that no file fits is not adopted (the start fails)
        types = self._types
        for path, info, schema in footers:
            found[path] = info
            if schema is None:
                continue
            names.update(dict.fromkeys(schema.names + list(info.partitions)))
            norm = with_partitions(normalize(schema, self.columns), info.partitions, types, self.columns)
            try:
                bad = check_values(info.partitions, types)
                if bad is not None:
                    raise SchemaConflict(bad)
                if fixed is not None:
                    check_fits(fixed, norm, "the cache's schema" if self.target is not None else "--schema-file")
                else:
                    target = unify(target, norm)
                fitting += 1
            except SchemaConflict as e:
                found[path] = info.quarantine(f"schema: {e}", ErrorKind.SCHEMA)
                log.warning("quarantined %s: %s", path, e,
                            extra={"event": "file_quarantined", "path": path, "error_class": ErrorKind.SCHEMA})
        if self.target is None and target is not None and fitting:
            try:
                schema, skipped = infer_schema(target, self.columns, list(names))
            except UnsupportedColumn as e:
                raise RemoteError(f"source {self.remote.url!r}: {e}") from None
            values = {"schema": schema.to_json(), "skipped_columns": skipped, "arrow_schema": str(target),
                      "arrow_schema_ipc": to_text(target)}
            self.writer.put_meta({source_key(self.source, k): v for k, v in values.items()}).result()
            self.schema, self.skipped, self.target = schema, skipped, target
            for name, why in skipped.items():
                log.warning("column %r is left out: %s", name, why, extra={"event": "column_skipped"})
        return found

    def _partition_types(self, parts: dict[str, dict[str, str | None]]) -> dict[str, pa.DataType]:
        """Partition columns' types: as the cache's or the pinned schema has them, else as the table's own schema
        (Delta) says, else inferred over the values of every file listed (as pyarrow.dataset infers them over a
        whole dataset)."""
        fixed = self.target if self.target is not None else self.pinned
        given = fixed if fixed is not None else getattr(self.remote, "partition_schema", None)
        return partition_types(parts.values(), given)
