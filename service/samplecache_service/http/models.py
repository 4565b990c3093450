"""Pydantic models of the HTTP API's responses (the OpenAPI at /docs is built from these)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from samplecache.format.constants import MAX_NUMBER
from samplecache_service.config.settings import Pacing
from samplecache_service.epochs.jobs import NAME_PATTERN, RUN_PATTERN
from samplecache_service.store.eviction import POLICIES

# Request bodies: no extra fields, no coercion (``true`` is not 1, ``9899.0`` is not an int).
STRICT = ConfigDict(extra="forbid", strict=True)
# A size as text: digits, an optional fraction, an optional unit (B, kB, MB, ..., KiB, MiB, ..., case-insensitive).
UNIT = "([kKmMgGtTpPeE]([iI][bB]|[bB])?|[bB])?"
SIZE_PATTERN = rf"^ ?[0-9]{{1,12}}(\.[0-9]{{1,6}})? ?{UNIT} ?$"
Size = Annotated[int, Field(ge=0, le=MAX_NUMBER)] | Annotated[str, Field(pattern=SIZE_PATTERN, max_length=32)]
# A budget is at least one byte: no zero, no fraction that could round to it.
Budget = Annotated[int, Field(ge=1, le=MAX_NUMBER)] | Annotated[str, Field(pattern=rf"^ ?[1-9][0-9]{{0,14}} ?{UNIT} ?$",
                                                                   max_length=32)]


class Problem(BaseModel):
    """Every 4xx (and 503) reply: what went wrong, naming the field or thing, never echoing a sent value."""

    detail: str = Field(description="What went wrong, in words")
    next_epoch: int | None = Field(None, description="With a 410 for a job's epoch: the job epoch to go on at")
    known: list[str] | None = Field(None, description="With a 404 for a job: the jobs the daemon knows (100 at most)")


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses``: each status code answered with a ``Problem``."""
    return {code: {"model": Problem} for code in codes}


class AuthStatus(BaseModel):
    required: bool = Field(description="Requests that change state need 'Authorization: Bearer <token>'")
    token_file: str | None = Field(description="The file that holds the token (readable by the cache dir's "
                                               "group), for clients on this host; None with --token or auth off")


class Health(BaseModel):
    ok: bool = True
    sources: dict[str, str] | None = Field(None, description="With several sources: each one's problem, or ok (a "
                                           "failing source leaves the daemon serving the others: 200)")


class EpochSummary(BaseModel):
    epoch: int
    samples: int
    new_samples: int = Field(description="Samples in shards the previous epoch did not have")
    shards: int
    bytes: int
    sealed_at: float
    remote_bytes: int = Field(0, description="Bytes fetched from the remote since the previous epoch was sealed")


class SamplerStatus(BaseModel):
    state: str = Field(description="discovering | sampling | paused | remote error | crash loop")
    reason: str | None = Field(None, description="Why sampling is paused, or why the samplers crash at start")
    processes: int
    in_flight: int
    restarts: int
    start_failures: int = Field(0, description="Sampler processes that died before they were ready, since start")


class IngestStatus(BaseModel):
    samples_per_s: float
    bytes_per_s: float
    commits: int


class RemoteStatus(BaseModel):
    bytes_read: int = Field(description="Bytes fetched from the remote since the daemon started")
    bytes_since_last_epoch: int = Field(description="Bytes fetched since the last epoch was sealed")
    sampler_bytes: int = Field(0, description="Bytes the samplers fetched (column chunks and footers; discovery's "
                                              "footer reads not included)")
    needed_bytes: int = Field(0, description="Bytes of the column chunks the units sampled so far needed")
    read_amplification: float | None = Field(None, description="sampler_bytes / needed_bytes: what the samplers "
                                                               "fetched per byte they needed (null before a unit)")


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


class FilesListed(BaseModel):
    parquet: int = Field(description="Parquet files (*.parquet, *.parq, *.pq) the last listing of the source found")
    skipped: int = Field(description="Other files it found and skipped (README.txt, data.csv, _SUCCESS)")
    skipped_text: str = Field(description="The skipped files in words: how many, and the first few by name")
    listed_at: float = Field(description="When the source was last listed (Unix time)")
    filter: str | None = Field(None, description="The partition filter (--filter) in use; null: none")
    outside_filter: int = Field(0, description="Parquet files the filter left out of the last listing (never "
                                "fetched)")


class TableStatus(BaseModel):
    format: str = Field(description="The table's format: delta")
    version: int | None = Field(description="The table version the last listing read (its live files are sampled)")
    pinned: bool = Field(description="Whether that version is pinned, else the newest one is followed")
    files: int = Field(description="Live data files of that version")
    rows: int = Field(description="Rows of those files, as the table's log counts them")
    removed_files: int = Field(description="Files that left the table since the cache began: never sampled again, "
                               "their shards named by no new epoch")
    seen_at: float | None = Field(description="When that version was read (Unix time)")


class SourceStatus(BaseModel):
    """One named source: what it holds of its share, and how its sampling goes."""

    name: str
    url: str = Field(description="Its URL, credentials masked")
    share: float = Field(description="Its fraction of max_bytes")
    max_bytes: int = Field(description="Its share of the budget, in bytes")
    bytes: int
    samples: int
    shards: int
    state: str = Field(description="discovering | remote error | crash loop | paused | sampling")
    reason: str | None = Field(None, description="Why it does not sample now, if it does not")
    problem: str | None = Field(None, description="What is wrong with it (a failing remote, every file "
                                "quarantined), also in /healthz")
    coverage: dict[str, Any] | None
    remote_bytes: int = Field(description="Bytes its listings and footers read from the remote")
    remote_errors: int
    last_error: str | None
    allowance_bytes: int = Field(0, description="Bytes it may still replace this epoch once its share is full "
                                 "(pacing=epoch: replace_per_epoch x its share per epoch)")
    quarantined: int = Field(description="Its quarantined files")
    skipped_columns: dict[str, str] = Field(default_factory=dict)
    filter: str | None = Field(None, description="Its partition filter (its own, or --filter's): it samples only "
                               "the files inside it")
    ready: bool = Field(description="Whether a new epoch names its shards")


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
    leases: list[dict[str, Any]] = Field(description="The newest live leases (at most 50: leases_live counts them "
                                                     "all)")
    leases_live: int = Field(description="Live leases")
    leases_by_job: dict[str, int] = Field(description="Live leases per job")
    jobs: int = Field(description="Jobs that are not expired (GET /v1/jobs lists them)")
    pinned_epochs: list[int]
    lmdb: dict[str, int] = Field(description="LMDB file size on disk, pages in use, map size")
    quarantined: list[Quarantined]
    skipped_columns: dict[str, str] = Field(default_factory=dict, description="Source columns left out, and why "
                                            "(the first source's; sources has each)")
    files: FilesListed | None = Field(None, description="What the last listing of the source found: Parquet files "
                                      "and the other files skipped (null before the first listing)")
    table: TableStatus | None = Field(None, description="The source's table (a Delta Lake table), as the last "
                                      "listing read it; null for a folder of Parquet files")
    coverage: dict[str, Any] | None = Field(description="How much of the source this pass sampled (the first "
                                            "source's; sources has each)")
    settings: dict[str, Any] = Field(description="Settings in use (run-time ones as changed by PATCH /v1/config or a "
                                     "reload; secrets left out)")
    config: dict[str, Any] = Field(default_factory=dict, description="The config file, and the last reload (SIGHUP): "
                                   "when, its error if it failed, and settings that changed but need a restart")
    auth: AuthStatus = Field(description="Whether mutations need the token, and where a client on this host reads it")
    health: dict[str, Any] = Field(default_factory=dict, description="Problems (what /healthz reports), failures per "
                                   "background thread, failed sampling tasks per cause")
    sources: list[SourceStatus] = Field(default_factory=list, description="Each named source (one, default, for "
                                        "a bare --source)")


class SchemaOut(BaseModel):
    format_version: int
    columns: list[dict[str, Any]]
    skipped_columns: dict[str, str] = Field(default_factory=dict, description="Source columns left out, and why")
    arrow_schema: str | None = None


# A lease for a job names the job's run and epoch too (said in the OpenAPI as well as checked).
_JOB_LEASE: JsonDict = {"if": {"properties": {"job": {"type": "string"}}, "required": ["job"]},
                        "then": {"properties": {"run": {"type": "string"}, "job_epoch": {"type": "integer"}},
                                 "required": ["run", "job_epoch"]}}


class LeaseIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_JOB_LEASE)

    job: str | None = Field(None, pattern=NAME_PATTERN, description="The job whose reader takes the lease")
    run: str | None = Field(None, pattern=RUN_PATTERN, description="The job's run (checked: a replaced run gets 409)")
    job_epoch: int | None = Field(None, ge=0, le=MAX_NUMBER, description="The job's epoch number for this daemon epoch")
    ttl: float | None = Field(None, gt=0, le=3600,
                              description="Seconds without a heartbeat before it expires (default: --lease-ttl)")
    holder: str | None = Field(None, max_length=200, description="Free text naming the reader (host, rank, worker)")

    @model_validator(mode="after")
    def _job_lease(self) -> "LeaseIn":
        if self.job is not None and (self.run is None or self.job_epoch is None):
            raise ValueError("a lease for a job needs its run and job_epoch too")
        return self


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
    read_sources: dict[str, int] = Field(default_factory=dict, description="Of them, per source (a mixture's reader)")


class HeartbeatIn(BaseModel):
    model_config = STRICT

    read: int | None = Field(None, ge=0, le=MAX_NUMBER, description="Samples this reader has read so far")
    read_sources: dict[str, Annotated[int, Field(ge=0, le=MAX_NUMBER)]] | None = Field(
        None, max_length=1024, description="Of them, per source (a mixture's reader)")


class JobIn(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=NAME_PATTERN, description="The job's name (letters, digits, '.', '_', '-'; at most 64)")
    run: str = Field(pattern=RUN_PATTERN, description="Random id shared by every process of one run")
    resume: bool = Field(False, description="The job must exist already (a restart from saved state): 404 if not")


class JobEpochOut(BaseModel):
    job_epoch: int
    daemon_epoch: int = Field(description="The daemon epoch it reads: GET /v1/epochs/{daemon_epoch} is its manifest")
    samples: int | None = Field(None, description="Samples of that epoch (None once its summary is gone)")
    samples_read: int = Field(description="Samples the job's readers delivered to its training loop in this epoch, "
                              "per reader: after a crash and a resume from a checkpoint, the samples read after "
                              "the checkpoint and before the crash are delivered (and counted) again, so this can "
                              "exceed samples")
    leases: int = Field(description="Live leases of the job on it")
    mixture: dict[str, Any] | None = Field(None, description="The mixture it reads, as its readers recorded it: "
                                           "mixture (weights), mix, epoch_samples and counts (samples per source)")
    samples_read_by_source: dict[str, int] = Field(default_factory=dict, description="samples_read per source "
                                                   "(a mixture's readers report it)")


class MixtureIn(BaseModel):
    model_config = STRICT

    mixture: dict[str, float] = Field(max_length=1024, description="The weights asked for (normalised)")
    mix: str = Field("random", pattern="^(random|stratified)$")
    epoch_samples: int | None = Field(None, ge=1, le=MAX_NUMBER)
    counts: dict[str, Annotated[int, Field(ge=0, le=MAX_NUMBER)]] = Field(max_length=1024, description="The "
                                                                           "epoch's samples per source")


class JobOut(BaseModel):
    name: str
    state: str = Field(description="reading (a live lease), idle, or expired (no lease and no request for the TTL)")
    created_at: float
    last_seen: float = Field(description="Last request or heartbeat of the job's current run")
    last_heartbeat: float | None = Field(None, description="Latest lease heartbeat (or lease taken) of the job")
    start_epoch: int = Field(description="First job epoch of the current run")
    next_epoch: int = Field(description="The first job epoch not mapped yet")
    runs: int = Field(description="Runs that attached under this name (restarts)")
    samples_read: int = Field(description="Samples delivered over all its epochs (re-reads after a resume "
                              "included: see the epochs' samples_read)")
    leases: list[dict[str, Any]] = Field(description="Live leases: daemon epoch, job epoch, holder, samples read")
    epochs: list[JobEpochOut] = Field(description="The latest epochs, newest last")


class JobEpochMap(BaseModel):
    job: str
    job_epoch: int
    daemon_epoch: int
    samples: int

class ShardOut(BaseModel):
    id: int
    source: str = Field("default", description="The named source it was sampled for")
    path: str = Field(description="The remote file the shard's rows come from")
    row_group: int = Field(description="Its first row group")
    row_groups: int = Field(1, description="Consecutive row groups of the unit, from row_group")
    first_row: int = Field(-1, description="Row of the file that is the shard's sample 0 "
                           "(sample j is row first_row + j)")
    partitions: dict[str, str | None] = Field(default_factory=dict, description="The file's partition values "
                                              "(Hive folders or the table's log), as text; null: a null value")
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


# the stores a PATCH may name as a source: remote ones only (file://, zip://, memory:// stay in the config file); an
# iceberg:// table is one of the catalogs the config file defines, where the catalog says it lies
REMOTE_PROTOCOLS = ("iceberg", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "http", "https", "hf", "oss",
                    "webhdfs", "hdfs", "sftp", "ftp")
REMOTE_URL = re.compile(rf"^({'|'.join(REMOTE_PROTOCOLS)})://[^\s]+$")
SOURCE_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")


# one source of PATCH /v1/config's ``sources``, as documented; checked by the route (routes/control.py), whose
# refusals of what the schema allows are 409s naming the field (never echoing the value)
SOURCE_IN: JsonDict = {"type": "object", "properties": {
    "url": {"type": "string", "description": "A remote store's fsspec URL (s3://, gs://, az://, https://...); never "
            "a path on the daemon's disk"},
    "share": {"type": ["number", "null"], "description": "Its fraction of max_bytes (null: an equal part of what "
              "the others leave)"},
    "filter": {"type": ["string", "null"], "description": "Its partition filter (null: --filter's); sources of one "
               "URL with different filters are filters of one table. A kept source's cannot change"}},
    "required": ["url"]}


class ConfigIn(BaseModel):
    model_config = STRICT

    sources: dict[str, Any] | None = Field(
        None, min_length=1, max_length=1024, json_schema_extra={"additionalProperties": SOURCE_IN},
        description="The whole set of named sources after the change, name -> {url, share, filter}: a source left "
        "out is "
        "removed (its "
        "shards go once no lease pins them), a new one is added, a share changed is applied at once; a source's URL "
        "cannot change")

    max_bytes: Budget | None = Field(None, description="New budget: bytes or a size such as '500GB', '2GiB'")
    eviction_policy: str | None = Field(None, pattern=f"^({'|'.join(sorted(POLICIES))})$",
                                        description=f"{', '.join(sorted(POLICIES))}")
    min_free_disk: Size | None = Field(None, description="Bytes or a size")
    epoch_max_samples: int | None = Field(None, ge=0, le=MAX_NUMBER,
                                          description="Cap on the samples of an epoch (0: none)")
    pacing: Pacing | None = Field(None, description="epoch or off")
    replace_per_epoch: float | None = Field(None, ge=0.0, le=1.0,
                                            description="Share of the budget replaced per sealed epoch, 0 to 1")
    max_ingest_rate: Size | None = Field(None, description="Remote bytes per second at most: "
                                         "bytes or a size (0: no cap)")


class ConfigOut(BaseModel):
    sources: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Each source's URL (credentials "
                                               "masked), share and filter")
    max_bytes: int
    eviction_policy: str
    min_free_disk: int
    epoch_max_samples: int
    pacing: str
    replace_per_epoch: float
    max_ingest_rate: int
