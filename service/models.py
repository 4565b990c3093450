"""Pydantic models of the HTTP API's responses (the OpenAPI at /docs is built from these)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Problem(BaseModel):
    detail: str = Field(description="What went wrong, in words")


class Health(BaseModel):
    ok: bool = True


class EpochSummary(BaseModel):
    epoch: int
    samples: int
    new_samples: int = Field(description="Samples in shards the previous epoch did not have")
    shards: int
    bytes: int
    sealed_at: float


class SamplerStatus(BaseModel):
    state: str = Field(description="discovering | sampling | paused | remote error")
    reason: str | None = Field(None, description="Why sampling is paused")
    processes: int
    in_flight: int
    restarts: int


class IngestStatus(BaseModel):
    samples_per_s: float
    bytes_per_s: float
    commits: int


class Quarantined(BaseModel):
    path: str
    reason: str
    at: float | None = None


class Status(BaseModel):
    version: str
    uptime_s: float
    source: str
    cache_dir: str
    bytes: int = Field(description="Resident sample bytes")
    max_bytes: int
    samples: int
    shards: int
    map_size: int
    disk_free: int
    epochs_sealed: int
    last_epoch: int
    epochs: list[EpochSummary]
    sampler: SamplerStatus
    ingest: IngestStatus
    remote_errors: int
    last_error: str | None
    evictions: int = Field(description="Shards evicted since start")
    eviction_policy: str
    leases: list[dict[str, Any]] = Field(description="Live leases")
    pinned_epochs: list[int]
    lmdb: dict[str, int] = Field(description="LMDB file size on disk, pages in use, map size")
    quarantined: list[Quarantined]
    coverage: dict[str, Any] | None
    settings: dict[str, Any]


class SchemaOut(BaseModel):
    format_version: int
    columns: list[dict[str, Any]]
    skipped_columns: dict[str, str] = Field(default_factory=dict, description="Source columns left out, and why")
    arrow_schema: str | None = None


class LeaseIn(BaseModel):
    ttl: float | None = Field(None, gt=0, le=3600, description="Seconds without a heartbeat before it expires (default: --lease-ttl)")
    holder: str | None = Field(None, max_length=200, description="Free text naming the reader (host, rank, worker)")


class LeaseOut(BaseModel):
    id: str
    epoch: int
    ttl: float
    expires_at: float
    created_at: float
    holder: str | None = None


class ShardOut(BaseModel):
    id: int
    path: str
    row_group: int
    rows: int
    bytes: int
    created: float
    last_used_epoch: int
    pinned: bool


class ShardPage(BaseModel):
    total: int
    offset: int
    limit: int
    shards: list[ShardOut]


class SamplerControl(BaseModel):
    paused: bool
    state: str


class ConfigIn(BaseModel):
    model_config = {"extra": "forbid"}

    max_bytes: int | str | None = Field(None, description="New budget: bytes or a size such as '500GB', '2GiB'")
    eviction_policy: str | None = Field(None, description="fifo, random or lru")
    min_free_disk: int | str | None = Field(None, description="Bytes or a size")
    epoch_max_samples: int | None = Field(None, ge=0, description="Cap on the samples of an epoch (0: none)")


class ConfigOut(BaseModel):
    max_bytes: int
    eviction_policy: str
    min_free_disk: int
    epoch_max_samples: int
