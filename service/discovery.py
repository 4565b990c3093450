"""Discovery: list the source, read new files' footers, check their schema, quarantine bad ones."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from samplecache.record import Schema
from samplecache.service.catalog import Catalog
from samplecache.service.encoder import UnsupportedColumn, column_for, infer_schema
from samplecache.service.remote import RemoteError, RemoteStore, classify_error
from samplecache.service.writer import Writer

log = logging.getLogger("samplecache.discovery")

FOOTER_THREADS = 8


class Discovery:
    def __init__(self, remote: RemoteStore, catalog: Catalog, writer: Writer, columns: list[str] | None) -> None:
        self.remote, self.catalog, self.writer, self.columns = remote, catalog, writer, columns
        raw = catalog.meta("schema")
        self.schema: Schema | None = Schema.from_json(raw) if raw else None
        self.skipped: dict[str, str] = catalog.meta("skipped_columns", {}) or {}

    def run(self) -> list[str]:
        """List the source; record the new files (row groups or quarantine). Returns the new paths."""
        paths = self.remote.list_files()
        known = self.catalog.files()
        new = [p for p in paths if p not in known]
        if not new:
            return []
        seq = 1 + max((int(i.get("seq", 0)) for i in known.values()), default=0)
        found: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(FOOTER_THREADS) as pool:
            for path, info, schema in pool.map(self._footer, new):
                if schema is not None:
                    info = self._check_schema(info, schema)
                info["seq"] = seq
                found[path] = info
        self.writer.put_files(found).result()
        if self.schema is None:
            raise RemoteError(f"no readable Parquet file under source {self.remote.url!r}")
        log.info("source %s: %d new file(s)", self.remote.url, len(found))
        return sorted(found)

    def _footer(self, path: str) -> tuple[str, dict[str, Any], pa.Schema | None]:
        try:
            info, schema = self.remote.file_info(path)
            md_bytes = list(info.row_group_bytes)
            return path, {"row_groups": list(info.row_groups), "row_group_bytes": md_bytes, "size": info.size}, schema
        except Exception as e:
            if classify_error(e) == "unreachable":
                raise
            return path, quarantined(f"unreadable footer: {type(e).__name__}: {e}"), None

    def _check_schema(self, info: dict[str, Any], arrow_schema: pa.Schema) -> dict[str, Any]:
        try:
            if self.schema is None:
                schema, skipped = infer_schema(arrow_schema, self.columns)
                self.writer.put_meta({"schema": schema.to_json(), "skipped_columns": skipped,
                                      "arrow_schema": str(arrow_schema)}).result()
                self.schema, self.skipped = schema, skipped
                return info
            for col in self.schema.columns:
                if col.name not in arrow_schema.names:
                    raise UnsupportedColumn(f"column {col.name!r} is missing")
                got = column_for(arrow_schema.field(col.name))
                if (got.kind, got.dtype, got.shape) != (col.kind, col.dtype, col.shape):
                    raise UnsupportedColumn(f"column {col.name!r} is {got.kind} {got.dtype} {got.shape}, "
                                            f"expected {col.kind} {col.dtype} {col.shape}")
            return info
        except UnsupportedColumn as e:
            return quarantined(f"schema mismatch: {e}")


def quarantined(reason: str, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """File info marking a file as quarantined (its units are skipped, never retried)."""
    out = dict(info or {"row_groups": []})
    out.update(quarantined=True, reason=reason, at=time.time())
    return out
