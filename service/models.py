"""Pydantic models of the HTTP API's responses (the OpenAPI at /docs is built from these)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from samplecache.service.jobs import NAME_PATTERN, RUN_PATTERN


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
    remote_bytes: int = Field(0, description="Bytes fetched from the remote since the previous epoch was sealed")


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


class RemoteStatus(BaseModel):
    bytes_read: int = Field(description="Bytes fetched from the remote since the daemon started")
    bytes_since_last_epoch: int = Field(description="Bytes fetched since the last epoch was sealed")


class PacingStatus(BaseModel):
    mode: str = Field(description="epoch (replacement paced per sealed epoch) or off")
    replace_per_epoch: float
    max_ingest_rate: int = Field(description="Remote bytes per second at most (0: no cap)")
    allowance_bytes: int = Field(description="Remote bytes still allowed for replacing old samples")
    reason: str | None = Field(None, description="Why the pace holds sampling now, if it does")


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
    remote: RemoteStatus
    pacing: PacingStatus
    remote_errors: int
    last_error: str | None
    evictions: int = Field(description="Shards evicted since start")
    eviction_policy: str
    leases: list[dict[str, Any]] = Field(description="Live leases")
    jobs: int = Field(description="Jobs that are not expired (GET /v1/jobs lists them)")
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
    job: str | None = Field(None, pattern=NAME_PATTERN, description="The job whose reader takes the lease")
    run: str | None = Field(None, pattern=RUN_PATTERN, description="The job's run (checked: a replaced run gets 409)")
    job_epoch: int | None = Field(None, ge=0, le=2**62, description="The job's epoch number for this daemon epoch")
    ttl: float | None = Field(None, gt=0, le=3600, description="Seconds without a heartbeat before it expires (default: --lease-ttl)")
    holder: str | None = Field(None, max_length=200, description="Free text naming the reader (host, rank, worker)")


class LeaseOut(BaseModel):
    id: str
    epoch: int
    ttl: float
    expires_at: float
    created_at: float
    holder: str | None = None
    job: str | None = None
    job_epoch: int | None = None
    read: int = 0


class HeartbeatIn(BaseModel):
    read: int | None = Field(None, ge=0, le=2**62, description="Samples this reader has read so far")


class JobIn(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(pattern=NAME_PATTERN, description="The job's name (letters, digits, '.', '_', '-'; at most 64)")
    run: str = Field(pattern=RUN_PATTERN, description="Random id shared by every process of one run")
    resume: bool = Field(False, description="The job must exist already (a restart from saved state): 404 if not")


class JobEpochOut(BaseModel):
    job_epoch: int
    daemon_epoch: int = Field(description="The daemon epoch it reads: GET /v1/epochs/{daemon_epoch} is its manifest")
    samples: int | None = Field(None, description="Samples of that epoch (None once its summary is gone)")
    samples_read: int = Field(description="Samples the job's readers reported reading")
    leases: int = Field(description="Live leases of the job on it")


class JobOut(BaseModel):
    name: str
    state: str = Field(description="reading (a live lease), idle, or expired (no lease and no request for the TTL)")
    created_at: float
    last_seen: float = Field(description="Last request or heartbeat of the job's current run")
    last_heartbeat: float | None = Field(None, description="Latest lease heartbeat (or lease taken) of the job")
    start_epoch: int = Field(description="First job epoch of the current run")
    next_epoch: int = Field(description="The first job epoch not mapped yet")
    runs: int = Field(description="Runs that attached under this name (restarts)")
    samples_read: int
    leases: list[dict[str, Any]] = Field(description="Live leases: daemon epoch, job epoch, holder, samples read")
    epochs: list[JobEpochOut] = Field(description="The latest epochs, newest last")


class JobEpochMap(BaseModel):
    job: str
    job_epoch: int
    daemon_epoch: int
    samples: int

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
    pacing: str | None = Field(None, description="epoch or off")
    replace_per_epoch: float | None = Field(None, ge=0.0, le=1.0, description="Share of the budget replaced per sealed epoch, 0 to 1")
    max_ingest_rate: int | str | None = Field(None, description="Remote bytes per second at most: bytes or a size (0: no cap)")


class ConfigOut(BaseModel):
    max_bytes: int
    eviction_policy: str
    min_free_disk: int
    epoch_max_samples: int
    pacing: str
    replace_per_epoch: float
    max_ingest_rate: int
