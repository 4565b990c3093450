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
    new_samples: int = Field(description="Samples more than the previous epoch had")
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
    quarantined: list[Quarantined]
    coverage: dict[str, Any] | None
    settings: dict[str, Any]


class SchemaOut(BaseModel):
    format_version: int
    columns: list[dict[str, Any]]
    skipped_columns: dict[str, str] = Field(default_factory=dict, description="Source columns left out, and why")
    arrow_schema: str | None = None
