"""What a lake table's reader (Delta, Iceberg) keeps of the version it read last: its live files' partition values,
rows and when, and what /v1/status shows of it. Each format's reader fills them in its ``list_files``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa

from samplecache_service.remote.stores import FsspecRemote, s3_endpoint


class LiveTable:
    format = ""

    def __init__(self, remote: FsspecRemote, version: int | None = None, as_of: datetime | None = None) -> None:
        """``version``: a pinned version (a Delta version, an Iceberg snapshot id); ``as_of``: a pinned time."""
        self.url, self.root = remote.url, remote.root.rstrip("/")
        self.pinned_version, self.as_of = version, as_of
        self.version: int | None = None  # the version the last listing read
        self.rows = 0  # rows of the live files, as the table's metadata counts them
        self.seen_at: float | None = None  # when that version was read
        self.partition_schema: pa.Schema | None = None  # partition columns the table's schema types
        self.parts: dict[str, dict[str, str | None]] = {}  # live file -> its partition values
        protocol = getattr(remote.fs, "protocol", "file")
        self.scheme: str = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
        self.endpoint = s3_endpoint(remote.fs) if self.scheme in ("s3", "s3a") else None

    def partitions(self, path: str) -> dict[str, str | None]:
        """The file's partition values as the table's metadata gives them (never read from its path)."""
        return dict(self.parts.get(path, {}))

    def info(self) -> dict[str, Any]:
        """What /v1/status shows of the table: its format, version, live files and rows, when it was read."""
        pinned = self.pinned_version is not None or self.as_of is not None
        return {"format": self.format, "version": self.version, "pinned": pinned, "files": len(self.parts),
                "rows": self.rows, "seen_at": self.seen_at}
