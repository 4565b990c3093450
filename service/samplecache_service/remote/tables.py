"""Table sources: a root that is a Delta Lake or an Iceberg table is read through its log or metadata, so that
only the files live in the table's version are sampled (an overwrite leaves the old ones on storage until a vacuum
or an expiry). A table's files are still Parquet, read one row group at a time by ``FsspecRemote``; only its
listing differs.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from samplecache_service.remote.delta import DELTA_LOG, DeltaLog
from samplecache_service.remote.iceberg import METADATA_DIR, IcebergMetadata, metadata_files
from samplecache_service.remote.stores import FsspecRemote, RemoteError

# format -> (the package that reads it, the extra that installs it)
READERS = {"delta": ("deltalake", "pip install 'samplecache[delta]'  (adds deltalake)"),
           "iceberg": ("pyiceberg", "pip install 'samplecache[iceberg]'  (adds pyiceberg)")}


def table_format(remote: FsspecRemote) -> str | None:
    """``delta`` where the root holds ``_delta_log/``, ``iceberg`` where it holds ``metadata/*.metadata.json``,
    else None (a folder of Parquet files)."""
    root = remote.root.rstrip("/")
    if remote.fs.isdir(f"{root}/{DELTA_LOG}"):
        return "delta"
    if remote.fs.isdir(f"{root}/{METADATA_DIR}") and metadata_files(remote):
        return "iceberg"
    return None


def find_table(remote: FsspecRemote) -> Any:
    """The table at the source's root (refused, with the extra to install, when its reader is not installed: never
    read as a plain folder), else None."""
    try:
        kind = table_format(remote)
    except Exception as e:  # network, credentials: the same error a listing would give
        raise RemoteError(f"cannot list source {remote.url!r}: {type(e).__name__}: {e}") from e
    if kind is None:
        return None
    if remote.table_version is not None and remote.table_as_of is not None:
        raise RemoteError("give --table-version or --table-as-of, not both")
    package, extra = READERS[kind]
    if importlib.util.find_spec(package) is None:
        shown = {"delta": f"a Delta Lake table (it holds {DELTA_LOG}/)",
                 "iceberg": f"an Iceberg table (it holds {METADATA_DIR}/*.metadata.json)"}[kind]
        raise RemoteError(f"source {remote.url!r} is {shown}, and the {package} package that reads it is not "
                          f"installed: {extra}")
    if kind == "delta":
        return DeltaLog(remote, remote.table_version, remote.table_as_of)
    return IcebergMetadata(remote, remote.table_version, remote.table_as_of)
