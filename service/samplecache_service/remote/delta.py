"""Delta Lake tables: the live files of a table's version, read through its log with delta-rs (``deltalake``).

An overwrite leaves the old files on storage until a vacuum: only the log says which are live, and what their
partition values are. The version is read again at each listing.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Mapping

import pyarrow as pa

from samplecache_service.remote.livetable import LiveTable
from samplecache_service.remote.stores import FsspecRemote, RemoteError, TableRefused

DELTA_LOG = "_delta_log"
# reader features whose tables delta-rs lists correctly and whose files read as plain Parquet
DELTA_SAFE_FEATURES = {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "checkpointProtection"}


def delta_options(storage_options: Mapping[str, Any], endpoint: str | None) -> dict[str, str]:
    """delta-rs (object_store) options from the source's fsspec ones: credentials and endpoint; plain HTTP
    allowed where the endpoint is http:// (a local S3 server). What is not given here delta-rs takes from the
    usual AWS_* / AZURE_* / GOOGLE_* environment, as s3fs does."""
    client = dict(storage_options.get("client_kwargs") or {})
    names = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN"}
    out = {names[k]: str(v) for k, v in storage_options.items() if k in names and v is not None}
    endpoint = storage_options.get("endpoint_url") or client.get("endpoint_url") or endpoint
    if endpoint:
        out["AWS_ENDPOINT_URL"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    if client.get("region_name"):
        out["AWS_REGION"] = str(client["region_name"])
    return out


class DeltaLog(LiveTable):
    """A Delta Lake table's log: its live files at the current version (or ``version``) and their partition
    values, read again at every listing."""

    format = "delta"

    def __init__(self, remote: FsspecRemote, version: int | None = None, as_of: datetime | None = None) -> None:
        super().__init__(remote, version, as_of)
        self.table_uri = self.root if self.scheme in ("file", "local") else f"{self.scheme}://{self.root}"
        self.options = delta_options(remote.storage_options, self.endpoint)

    def _table(self) -> Any:
        from deltalake import DeltaTable

        try:
            dt = DeltaTable(self.table_uri, version=self.pinned_version, storage_options=self.options or None)
            if self.as_of is not None:
                dt.load_as_version(self.as_of)  # the version the table had at that time
            return dt
        except Exception as e:  # network, credentials, a damaged log: all surface the same way
            raise RemoteError(f"cannot read the Delta table {self.url!r}: {type(e).__name__}: {e}") from e

    def list_files(self, remote: FsspecRemote) -> list[str]:
        """The live files of the table's version; their sizes and signatures (size and modification time, from
        the log) set on ``remote`` as a listing sets them."""
        dt = self._table()
        refuse_unsupported(dt, self.url)
        actions = pa.table(dt.get_add_actions(flatten=True))
        schema = pa.schema(dt.schema().to_arrow())
        keys = list(dt.metadata().partition_columns)
        self.partition_schema = pa.schema([schema.field(k) for k in keys])
        # the log's values typed as the table's schema says, as text (as Hive folders give them)
        texts = {k: actions.column(f"partition.{k}").cast(pa.string()).to_pylist() for k in keys}
        paths = [f"{self.root}/{p}" for p in actions.column("path").to_pylist()]
        sizes = [int(n) for n in actions.column("size_bytes").to_pylist()]
        mtimes = actions.column("modification_time").to_pylist()
        self.parts = {p: {k: texts[k][i] for k in keys} for i, p in enumerate(paths)}
        remote.sizes = dict(zip(paths, sizes))
        remote.signatures = {p: f"{s}:{m}" for p, s, m in zip(paths, sizes, mtimes)}
        remote.others = []
        records = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else []
        self.rows = sum(int(n or 0) for n in records)
        self.version, self.seen_at = int(dt.version()), time.time()
        if not paths:
            raise RemoteError(f"the Delta table {self.url!r} has no data file at version {self.version}")
        return sorted(paths)


def refuse_unsupported(dt: Any, url: str) -> None:
    """RemoteError naming the table feature samplecache cannot serve exactly: deletion vectors (their deleted rows
    would be served) and column mapping (files' physical column names differ from the table's)."""
    protocol = dt.protocol()
    features = set(protocol.reader_features or ())
    config = dict(dt.metadata().configuration or {})
    mapping = config.get("delta.columnMapping.mode", "none")
    if "columnMapping" in features or mapping != "none" or protocol.min_reader_version == 2:
        raise TableRefused(f"the Delta table {url!r} uses column mapping (delta.columnMapping.mode={mapping}): "
                          f"samplecache cannot serve it yet; rewrite it without column mapping")
    if "deletionVectors" in features:
        raise TableRefused(f"the Delta table {url!r} has the deletionVectors reader feature: samplecache cannot serve "
                          f"it yet (its deleted rows would be served); rewrite it without deletion vectors "
                          f"(delta.enableDeletionVectors=false, then REORG TABLE ... APPLY (PURGE))")
    unknown = sorted(features - DELTA_SAFE_FEATURES)
    if unknown:
        raise TableRefused(f"the Delta table {url!r} has reader features samplecache does not serve: {unknown}")
