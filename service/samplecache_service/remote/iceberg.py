"""Iceberg tables: the live data files of a table's current snapshot, as its newest ``metadata/*.metadata.json``
says, planned by pyiceberg. Files an overwrite or delete replaced stay on storage until snapshots expire: only the
metadata says which are live. The newest metadata file is looked for again at each listing.

A table can also be named through a catalog (REST, SQL, Glue, ... through pyiceberg): ``iceberg://CATALOG/NS.TABLE``
with the catalog's properties in the ``iceberg_catalogs`` setting. The catalog says where the table lies (what the
samplers read) and, at each listing, which metadata is current.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from datetime import datetime
from typing import Any, Mapping

from samplecache_service.remote.livetable import LiveTable
from samplecache_service.remote.stores import FsspecRemote, RemoteError, TableRefused

METADATA_DIR = "metadata"
CATALOG_SCHEME = "iceberg://"
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


def catalog_name(url: str) -> tuple[str, str]:
    """(catalog, table identifier) of an ``iceberg://CATALOG/NAMESPACE.TABLE`` URL (ValueError when malformed)."""
    catalog, _, ident = url[len(CATALOG_SCHEME):].partition("/")
    ident = ident.strip("/")
    if not catalog or "." not in ident or ident.startswith(".") or ident.endswith("."):
        raise ValueError(f"an Iceberg catalog source is iceberg://CATALOG/NAMESPACE.TABLE, not {url!r}")
    return catalog, ident


class CatalogTable:
    """An Iceberg table a catalog names: loaded again at each listing (its current metadata is the catalog's)."""

    def __init__(self, url: str, catalogs: Mapping[str, Mapping[str, Any]], defaults: Mapping[str, str]) -> None:
        """``catalogs``: name -> pyiceberg catalog properties (the ``iceberg_catalogs`` setting); ``defaults``:
        FileIO properties the catalog's own override (the source's S3 endpoint and credentials)."""
        self.url = url
        self.catalog, self.ident = catalog_name(url)
        if self.catalog not in catalogs:
            raise RemoteError(f"source {url!r} names Iceberg catalog {self.catalog!r}, which the iceberg_catalogs "
                              f"setting does not define (it defines {sorted(catalogs) or 'none'})")
        self.properties = {**defaults, **{k: str(v) for k, v in catalogs[self.catalog].items()}}

    def load(self) -> Any:
        from pyiceberg.catalog import load_catalog

        try:
            return load_catalog(self.catalog, **self.properties).load_table(self.ident)
        except Exception as e:  # an unreachable catalog, no such table, bad credentials: all a remote error
            raise RemoteError(f"cannot load {self.ident!r} from Iceberg catalog {self.catalog!r}: "
                              f"{type(e).__name__}: {e}") from e


def catalog_table(url: str, catalogs: Mapping[str, Mapping[str, Any]],
                  storage_options: Mapping[str, Any]) -> tuple[CatalogTable, str]:
    """The table an ``iceberg://`` URL names, and the URL of its location (where its files lie). The source's
    credentials and the environment's S3 endpoint are the catalog's FileIO defaults: it reads the S3 the samplers
    read unless its own properties say otherwise."""
    if importlib.util.find_spec("pyiceberg") is None:
        raise RemoteError(f"source {url!r} is an Iceberg table in a catalog, and the pyiceberg package that reads it "
                          f"is not installed: pip install 'samplecache[iceberg]'  (adds pyiceberg)")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or \
        (storage_options.get("client_kwargs") or {}).get("endpoint_url") or storage_options.get("endpoint_url")
    table = CatalogTable(url, catalogs, iceberg_properties(storage_options, endpoint))
    location = str(table.load().location())
    return table, location if "://" in location else f"file://{location}"


class IcebergMetadata(LiveTable):
    """An Iceberg table read from its newest metadata file (or a pinned snapshot id; its version is the snapshot
    id). Identity partition columns are in the files themselves: no partition schema."""

    format = "iceberg"

    def __init__(self, remote: FsspecRemote, snapshot: int | None = None, as_of: datetime | None = None,
                 catalog: CatalogTable | None = None) -> None:
        """``catalog``: the table is the one a catalog names (else the newest metadata file under the root)."""
        super().__init__(remote, snapshot, as_of)
        self.properties = iceberg_properties(remote.storage_options, self.endpoint)
        self.catalog = catalog

    def _uri(self, path: str) -> str:
        return f"file://{path}" if self.scheme in ("file", "local") else f"{self.scheme}://{path}"

    def _table(self, remote: FsspecRemote) -> Any:
        from pyiceberg.table import StaticTable

        if self.catalog is not None:
            return self.catalog.load()
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
