"""Iceberg tables: the live data files of a table's current snapshot, as its newest ``metadata/*.metadata.json``
says, planned by pyiceberg. Files an overwrite or delete replaced stay on storage until snapshots expire: only the
metadata says which are live. The newest metadata file is looked for again at each listing.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any, Mapping

from samplecache_service.remote.livetable import LiveTable
from samplecache_service.remote.stores import FsspecRemote, RemoteError, TableRefused

METADATA_DIR = "metadata"
# 00003-<uuid>.metadata.json (a catalog's tables) or v3.metadata.json (a Hadoop table): the number orders them
_VERSION = re.compile(r"^(?:v)?(\d+)(?:-[^/]*)?\.metadata\.json$")


def metadata_files(remote: FsspecRemote) -> list[str]:
    """The table's metadata files, oldest first (by their number)."""
    found = []
    for path in remote.fs.ls(f"{remote.root.rstrip('/')}/{METADATA_DIR}", detail=False):
        m = _VERSION.match(str(path).rsplit("/", 1)[-1])
        if m:
            found.append((int(m.group(1)), str(path)))
    return [p for _, p in sorted(found)]


def iceberg_properties(storage_options: Mapping[str, Any], endpoint: str | None) -> dict[str, str]:
    """pyiceberg FileIO properties from the source's fsspec options: credentials, endpoint, region. What is not
    given here pyiceberg's readers take from the usual AWS_* environment, as s3fs does."""
    client = dict(storage_options.get("client_kwargs") or {})
    names = {"key": "s3.access-key-id", "secret": "s3.secret-access-key", "token": "s3.session-token"}
    out = {names[k]: str(v) for k, v in storage_options.items() if k in names and v is not None}
    endpoint = storage_options.get("endpoint_url") or client.get("endpoint_url") or endpoint
    if endpoint:
        out["s3.endpoint"] = str(endpoint)
        out["s3.region"] = str(client.get("region_name") or "us-east-1")  # a local S3 has no region to look up
    elif client.get("region_name"):
        out["s3.region"] = str(client["region_name"])
    return out


class IcebergMetadata(LiveTable):
    """An Iceberg table read from its newest metadata file (or a pinned snapshot id; its version is the snapshot
    id). Identity partition columns are in the files themselves: no partition schema."""

    format = "iceberg"

    def __init__(self, remote: FsspecRemote, snapshot: int | None = None, as_of: datetime | None = None) -> None:
        super().__init__(remote, snapshot, as_of)
        self.properties = iceberg_properties(remote.storage_options, self.endpoint)

    def _uri(self, path: str) -> str:
        return f"file://{path}" if self.scheme in ("file", "local") else f"{self.scheme}://{path}"

    def _table(self, remote: FsspecRemote) -> Any:
        from pyiceberg.table import StaticTable

        try:
            found = metadata_files(remote)
            if not found:
                raise RemoteError(f"the Iceberg table {self.url!r} has no {METADATA_DIR}/*.metadata.json")
            return StaticTable.from_metadata(self._uri(found[-1]), properties=self.properties)
        except RemoteError:
            raise
        except Exception as e:  # network, credentials, damaged metadata: all surface the same way
            raise RemoteError(f"cannot read the Iceberg table {self.url!r}: {type(e).__name__}: {e}") from e

    def list_files(self, remote: FsspecRemote) -> list[str]:
        """The live data files of the current (or pinned) snapshot; their sizes set on ``remote``."""
        table = self._table(remote)
        refuse_evolved(table, self.url)
        pinned = self.pinned_version
        if self.as_of is not None:
            snap = table.snapshot_as_of_timestamp(int(self.as_of.timestamp() * 1000))
            if snap is None:
                raise RemoteError(f"the Iceberg table {self.url!r} has no snapshot as of {self.as_of.isoformat()}")
            pinned = snap.snapshot_id
        try:
            tasks = list(table.scan(snapshot_id=pinned).plan_files())
        except Exception as e:  # noqa: BLE001 - reading manifests: the same failure as a listing's
            raise RemoteError(f"cannot plan the Iceberg table {self.url!r}: {type(e).__name__}: {e}") from e
        deletes = sum(len(t.delete_files) for t in tasks)
        if deletes:
            raise TableRefused(f"the Iceberg table {self.url!r} has {deletes} delete file(s) (merge-on-read deletes):"
                              f" samplecache cannot serve them yet (their deleted rows would be served); rewrite "
                              f"the table's data files (rewrite_data_files) or use copy-on-write deletes")
        spec, schema = table.spec(), table.schema()
        # identity partitions name a column of the data (written in every file too); other transforms do not
        identity = [(i, schema.find_field(f.source_id).name) for i, f in enumerate(spec.fields)
                    if str(f.transform) == "identity"]
        paths, parts, sizes = [], {}, {}
        for t in tasks:
            f = t.file
            if str(f.file_format).rsplit(".", 1)[-1].upper() != "PARQUET":
                raise TableRefused(f"the Iceberg table {self.url!r} has {f.file_format} data files: only Parquet "
                                  f"is served")
            path = type(remote.fs)._strip_protocol(f.file_path)
            paths.append(path)
            sizes[path] = int(f.file_size_in_bytes)
            parts[path] = {name: None if f.partition[i] is None else str(f.partition[i]) for i, name in identity}
        self.parts = parts
        self.rows = sum(int(t.file.record_count) for t in tasks)
        remote.sizes = sizes
        remote.signatures = {p: str(s) for p, s in sizes.items()}
        remote.others = []
        snap = table.current_snapshot() if pinned is None else table.snapshot_by_id(pinned)
        self.version, self.seen_at = (snap.snapshot_id if snap is not None else None), time.time()
        if not paths:
            raise RemoteError(f"the Iceberg table {self.url!r} has no data file in snapshot {self.version}")
        return sorted(paths)


def refuse_evolved(table: Any, url: str) -> None:
    """RemoteError when a column was renamed since a file may have been written: Iceberg matches a file's columns
    to the table's by field id, and the daemon reads them by name, so a renamed column would read as nulls."""
    names: dict[int, set[str]] = {}
    for schema in table.metadata.schemas:
        for field in schema.fields:
            names.setdefault(field.field_id, set()).add(field.name)
    renamed = sorted(min(n) for n in names.values() if len(n) > 1)
    if renamed:
        raise TableRefused(f"the Iceberg table {url!r} renamed columns {renamed} (column ids are not followed): "
                          f"samplecache cannot serve it yet")
