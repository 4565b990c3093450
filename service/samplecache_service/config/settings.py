"""The one settings object: flags, SAMPLECACHE_* environment and a config file
(service/samplecache_service/config/file.py), validated once at start and again on a reload."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, get_args

from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from samplecache.format.constants import MAX_NUMBER
from samplecache_service.config.mapsize import MAP_FACTOR, MAX_BUDGET, GiB, map_size_for

Pacing = Literal["epoch", "off"]
Auth = Literal["token", "off"]
LogFormat = Literal["text", "json"]
PACING: tuple[str, ...] = get_args(Pacing)
MIN_PART_BYTES = 64 << 10  # the smallest shard target
MIN_BUDGET = 4096  # the smallest max_bytes: one block
# the largest value of each size: beyond it a value is a typo, or more than what uses it can take (a block's length
# is 32 bits in a staging file; a sampler holds about 2 x unit_bytes; a request body is held in memory)
SIZE_LIMITS = {"max_bytes": MAX_BUDGET, "min_free_disk": 1 << 60, "max_ingest_rate": 1 << 60,
               "max_body_bytes": GiB, "block_bytes": GiB, "unit_bytes": 64 * GiB}
DAY = 86400.0
MAX_OPTIONS_FILE = 1 << 20  # a storage_options_file larger than this is not one
_SIZE = re.compile(r"\s*\d*\.?\d+\s*[A-Za-z]*\s*")


_from_file: ContextVar[dict[str, Any]] = ContextVar("samplecache_config_file", default={})


DEFAULT_SOURCE = "default"  # the name of a bare --source URL (and of a cache made before sources had names)
SOURCE_NAME = re.compile(r"[a-z0-9_-]{1,64}")
_NAMED = re.compile(r"([a-z0-9_-]{1,64})=(.+)", re.S)


class SourceSpec(BaseModel):
    """One named source: its fsspec URL, its share of ``max_bytes`` (None: an equal part of what the set shares
    leave) and its partition filter (None: ``--filter``'s). Sources with one URL and different filters are filters
    of one table, each with its own sample."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1)
    share: float | None = Field(None, gt=0, le=1)
    filter: str | None = Field(None, min_length=1, max_length=4096)


def named_pairs(value: Any, what: str) -> dict[str, str]:
    """``NAME=VALUE`` items (a list, or one comma-separated text) as a dict; a bad name is a ValueError."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: dict[str, str] = {}
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        m = _NAMED.fullmatch(item)
        if m is None:
            raise ValueError(f"{item!r} is not NAME={what} (a name is 1-64 characters of a-z, 0-9, _ and -)")
        out[m.group(1)] = m.group(2).strip()
    return out


def resolve_sources(source: str, sources: Mapping[str, SourceSpec], share: Mapping[str, float]
                    ) -> dict[str, tuple[str, float]]:
    """Each source's (URL, fraction of max_bytes): a bare ``source`` is ``default``; ``share`` overrules the
    sources' own. Shares that add up to more than 1, or that leave nothing for a source without one, are a
    ValueError naming them."""
    specs = dict(sources)
    if source:
        if DEFAULT_SOURCE in specs:
            raise ValueError(f"a bare --source URL is the source named {DEFAULT_SOURCE!r}, which sources "
                             f"also names: give one of them")
        specs = {DEFAULT_SOURCE: SourceSpec(url=source), **specs}
    unknown = sorted(set(share) - set(specs))
    if unknown:
        raise ValueError(f"share names unknown source(s) {unknown}; the sources are {sorted(specs)}")
    shares = {n: share.get(n, s.share) for n, s in specs.items()}
    for n, f in shares.items():
        if f is not None and not 0 < f <= 1:
            raise ValueError(f"source {n!r}: share {f} is not in (0, 1]")
    given = {n: f for n, f in shares.items() if f is not None}
    total = sum(given.values())
    if total > 1 + 1e-9:
        raise ValueError(f"the sources' shares add up to {total:g}, more than 1: "
                         + ", ".join(f"{n}={f:g}" for n, f in sorted(given.items())))
    rest = [n for n, f in shares.items() if f is None]
    if rest and total >= 1 - 1e-9:
        raise ValueError(f"the shares set ({', '.join(f'{n}={f:g}' for n, f in sorted(given.items()))}) leave "
                         f"nothing for {rest}: give them shares, or lower the others")
    each = (1 - total) / len(rest) if rest else 0.0
    return {n: (s.url, given.get(n, each)) for n, s in specs.items()}


# the eviction policies by name (store/eviction.py maps each to its order)
EVICTION_POLICIES = ("fifo", "lru", "random")


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1 (only this host can connect)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


class _ConfigFileSource(PydanticBaseSettingsSource):
    """The values of the config file (service/samplecache_service/config/file.py reads it): below flags and
    environment, above defaults."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return _from_file.get().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_from_file.get())


def _json_object_file(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (storage_options_file); the errors never quote the file's text."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_OPTIONS_FILE + 1)
    except OSError as e:
        raise ValueError(f"storage_options_file {path}: {e.strerror or e}") from None
    if len(raw) > MAX_OPTIONS_FILE:
        raise ValueError(f"storage_options_file {path} is larger than {MAX_OPTIONS_FILE} bytes: not a JSON object "
                         "of options")
    try:
        got = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"storage_options_file {path} is not JSON: {e}") from None
    if not isinstance(got, dict):
        raise ValueError(f"storage_options_file {path} must hold a JSON object")
    return got


def default_samplers() -> int:
    return max(1, (os.cpu_count() or 2) - 1)


class Settings(BaseSettings):
    """Every setting of the daemon. Each is a ``serve`` flag and a ``SAMPLECACHE_<NAME>`` variable."""

    # allow_inf_nan: no float setting means anything at nan or inf (an endless retry, a wait for ever)
    model_config = SettingsConfigDict(env_prefix="SAMPLECACHE_", extra="forbid", validate_default=True,
                                      allow_inf_nan=False)

    source: str = Field("", description="fsspec URL of a prefix, directory or glob of Parquet files "
                        "(s3://, gs://, file://, ...)")
    sources: Annotated[dict[str, SourceSpec], NoDecode] = Field(
        default_factory=dict, description="Named sources, each with its share of max_bytes: --source NAME=URL (many "
        "times), SAMPLECACHE_SOURCES=NAME=URL,... or a JSON object, or [sources.NAME] tables (url, share) in the "
        "config file; a bare --source URL is the source named default")
    share: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=dict, description="Named sources' shares of max_bytes: NAME=FRACTION (many times, or "
        "comma-separated); sources without one split what the others leave equally")
    cache_dir: Path = Field(Path("./samplecache-data"), description="Directory of the LMDB cache and the staging files")
    max_bytes: ByteSize = Field(ByteSize(10 * 2**30), description="Budget of resident sample bytes (e.g. 500GB, 2GiB)")
    min_free_disk: ByteSize = Field(ByteSize(2**30), description="Stop growing when the cache filesystem has less "
                                    "free space than this")
    samplers: int = Field(default_factory=default_samplers, ge=1, le=256,
                          description="Sampler subprocesses (default: cores - 1)")
    host: str = Field("127.0.0.1", description="Address to listen on (loopback by default)")
    port: int = Field(8750, ge=0, le=65535, description="HTTP port")
    token: str | None = Field(None, description="Bearer token required by endpoints that change state "
                              "(unset: the token file's)")
    auth: Auth = Field("token", description="token (requests that change state need the bearer token) "
                       "or off (only on a loopback --host)")
    token_file: Path | None = Field(None, description="File of the bearer token when --token is unset: reused, "
                                    "or created with a random token, mode 0640 (default: <cache_dir>/api-token)")
    max_body_bytes: ByteSize = Field(ByteSize(2**20), description="Largest request body accepted "
                                     "(larger: 413, refused before it is read)")
    storage_options_file: Path | None = Field(None, description="File of a JSON object of fsspec options, read at "
                                              "start: credentials stay off the command line (storage_options' keys "
                                              "win over the file's)")
    storage_options: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict, description="JSON object passed to fsspec (endpoint, credentials, ...)")
    columns: list[str] | None = Field(None, description="Sample only these columns "
                                      "(comma-separated; default: all supported)")
    seed: int = Field(0, ge=0, le=MAX_NUMBER, description="Seed of the remote sampling order "
                      "(and of random eviction)")
    eviction_policy: str = Field("fifo", description="Which shards make room once the budget is reached: "
                                 "fifo, random or lru")
    epoch_headroom: float = Field(0.2, ge=0.0, lt=1.0, description="Fraction of the budget a new epoch leaves out "
                                  "(the policy's next evictions) so new shards fit while it is leased")
    lease_ttl: float = Field(60.0, gt=0, le=3600, description="Seconds a reader's lease on an epoch lives "
                             "without a heartbeat")
    max_leases: int = Field(16384, ge=1, le=1_000_000, description="Live leases the daemon holds at most; a take "
                            "past it is refused (429)")
    max_leases_per_job: int = Field(4096, ge=1, le=1_000_000, description="Live leases one job holds at most "
                                    "(ranks x workers x epochs read at once); a take past it is refused (429)")
    pacing: Pacing = Field("epoch", description="Once the cache is full: epoch (replace at most "
                           "replace_per_epoch x budget of remote bytes per sealed epoch; nothing while no job reads) "
                           "or off (replace as fast as the samplers go)")
    replace_per_epoch: float = Field(0.2, ge=0.0, le=1.0, description="With pacing=epoch: share of the budget "
                                     "fetched anew per sealed epoch once the cache is full "
                                     "(0: keep the sample as it is)")
    max_ingest_rate: ByteSize = Field(ByteSize(0), ge=0, description="Cap on remote bytes per second, also while "
                                      "filling (e.g. 200MB; 0: no cap)")
    epoch_max_samples: int = Field(0, ge=0, le=MAX_NUMBER, description="Cap on the samples of one epoch "
                                   "(0: every resident sample)")
    discover_interval: float = Field(300.0, gt=0, le=7 * DAY, description="Seconds between listings of the source "
                                     "for new files")
    num_nodes: int = Field(1, ge=1, le=1_000_000, description="How many hosts split the remote's row groups "
                           "between them")
    node_rank: int = Field(0, ge=0, description="This host's part of the remote when several hosts share it")
    block_bytes: ByteSize = Field(ByteSize(2**20), description="Target size of one stored block of rows")
    unit_bytes: ByteSize = Field(ByteSize(64 * 2**20), description="Target size of a shard: larger row groups are "
                                 "read in slices into several shards (a sampler holds about 2x this; "
                                 "at most 1/16 of max_bytes is used)")
    schema_file: Path | None = Field(None, description="A Parquet or Arrow IPC file whose schema pins the dataset's "
                                     "(e.g. pq.write_table(schema.empty_table(), 'schema.parquet')); "
                                     "default: the files' schemas unified")
    filter: str | None = Field(None, description="Sample only the partitions this matches, e.g. \"lang in ('en', "
                               "'de') and date >= '2024-01-01'\" (SQL over partition columns; decided from the "
                               "listing, so nothing outside it is fetched)")
    table_version: int | None = Field(None, ge=0, description="A table source's version to serve, pinned: a Delta "
                                      "table's version or an Iceberg table's snapshot id (default: the newest, "
                                      "followed as it changes)")
    table_as_of: datetime | None = Field(None, description="A table source served as it was at this time (ISO 8601, "
                                         "e.g. 2024-05-01T00:00:00Z): the version a Delta table had then, or an "
                                         "Iceberg table's snapshot then; not with table_version (refused)")
    iceberg_catalogs: Annotated[dict[str, dict[str, Any]], NoDecode] = Field(
        default_factory=dict, description="Iceberg catalogs a source may name as iceberg://CATALOG/NS.TABLE: name -> "
        "pyiceberg catalog properties (type = \"rest\" | \"sql\" | \"glue\" ..., uri, warehouse, credentials); "
        "a [iceberg_catalogs.NAME] table in the config file, or JSON in SAMPLECACHE_ICEBERG_CATALOGS")
    epoch_wait_max: float = Field(600.0, gt=0, le=DAY, description="Longest wait (s) a manifest request may ask "
                                  "for with min_samples")
    epochs_kept: int = Field(64, ge=1, le=1_000_000, description="Sealed epoch manifests kept besides those "
                             "leased or mapped by a job (older ones are dropped; a GET of one answers 410)")
    retry_seconds: float = Field(5.0, gt=0, le=3600, description="Back-off (s) after the remote is unreachable")
    log_level: str = Field("info", description="Log level: debug, info, warning, error")
    log_format: LogFormat = Field("text", description="Log lines as text (for people) or json "
                                  "(one object per line, stable keys, for log shippers)")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _ConfigFileSource(settings_cls)

    @classmethod
    def layered(cls, flags: dict[str, Any], file_values: dict[str, Any]) -> "Settings":
        """Settings from flags (keyword arguments), then the environment, then ``file_values``, then defaults."""
        token = _from_file.set(dict(file_values))
        try:
            return cls(**flags)
        finally:
            _from_file.reset(token)

    @field_validator("columns", mode="before")
    @classmethod
    def _split_columns(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [c.strip() for c in v.split(",") if c.strip()] or None
        return v

    @field_validator("sources", mode="before")
    @classmethod
    def _named_sources(cls, v: Any) -> Any:
        if isinstance(v, (str, bytes)):
            text = v.decode() if isinstance(v, bytes) else v
            v = json.loads(text) if text.strip().startswith("{") else named_pairs(text, "URL")
        elif isinstance(v, list):
            v = named_pairs(v, "URL")
        if not isinstance(v, dict):
            raise ValueError("must be NAME=URL items or a table of sources")
        for name in v:
            if not SOURCE_NAME.fullmatch(str(name)):
                raise ValueError(f"source name {name!r}: a name is 1-64 characters of a-z, 0-9, _ and -")
        return {k: {"url": s} if isinstance(s, str) else s for k, s in v.items()}

    @field_validator("share", mode="before")
    @classmethod
    def _shares(cls, v: Any) -> Any:
        if isinstance(v, list):  # --share given many times, each maybe comma-separated
            v = ",".join(str(x) for x in v)
        if isinstance(v, (str, bytes)):
            text = v.decode() if isinstance(v, bytes) else v
            v = json.loads(text) if isinstance(text, str) and text.strip().startswith("{") else named_pairs(
                text, "FRACTION")
        return v

    @model_validator(mode="after")
    def _source_shares(self) -> "Settings":
        self.named_sources()  # raises ValueError naming what is wrong
        return self

    def named_sources(self) -> dict[str, tuple[str, float]]:
        """Each source's (URL, fraction of max_bytes): a bare ``source`` is ``default`` (``resolve_sources``)."""
        return resolve_sources(self.source, self.sources, self.share)

    def source_filters(self) -> dict[str, str | None]:
        """Each source's partition filter: its own (``[sources.NAME] filter``), else ``--filter``."""
        return {n: (self.sources[n].filter if n in self.sources and self.sources[n].filter else self.filter)
                for n in self.named_sources()}

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        if v.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError("must be one of debug, info, warning, error")
        return v.lower()

    @field_validator("eviction_policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in EVICTION_POLICIES:
            raise ValueError(f"unknown eviction policy {v!r}; choose one of {', '.join(sorted(EVICTION_POLICIES))}")
        return v

    @field_validator("max_bytes", "min_free_disk", "block_bytes", "unit_bytes", "max_ingest_rate", "max_body_bytes",
                     mode="before")
    @classmethod
    def _whole_size(cls, v: Any) -> Any:
        if isinstance(v, str) and not _SIZE.fullmatch(v):
            raise ValueError(f"{v!r} is not a size (e.g. 500GB, 2GiB, 1.5 TiB, 1048576)")
        return v

    @field_validator("max_bytes")
    @classmethod
    def _positive(cls, v: ByteSize) -> ByteSize:
        if v <= 0:
            raise ValueError("must be positive")
        return v

    @field_validator(*SIZE_LIMITS)
    @classmethod
    def _not_absurd(cls, v: ByteSize, info: ValidationInfo) -> ByteSize:
        limit = SIZE_LIMITS[str(info.field_name)]
        if v > limit and info.field_name == "max_bytes":
            raise ValueError(f"its LMDB map ({map_size_for(v)} bytes: {MAP_FACTOR} x the budget + 1 GiB) is more than "
                             f"a 64-bit process can map: at most {limit // GiB}GiB")
        if v > limit:
            raise ValueError(f"must be at most {limit} bytes ({limit / GiB:g}GiB)")
        return v

    @field_validator("max_body_bytes")
    @classmethod
    def _body(cls, v: ByteSize) -> ByteSize:
        if v < 1024:
            raise ValueError("must be at least 1KiB")
        return v

    @field_validator("auth")
    @classmethod
    def _auth_off_on_loopback(cls, v: str, info: ValidationInfo) -> str:
        host = info.data.get("host")
        if v == "off" and host is not None and not is_loopback(host):
            raise ValueError(f"auth off is only allowed on a loopback --host (127.0.0.1, ::1, localhost), not "
                             f"{host!r}: anyone who can reach it could change the cache; keep --auth token")
        return v

    @field_validator("block_bytes", "unit_bytes")
    @classmethod
    def _block(cls, v: ByteSize) -> ByteSize:
        if v < 4096:
            raise ValueError("must be at least 4KiB")
        return v

    @field_validator("node_rank")
    @classmethod
    def _rank(cls, v: int, info: ValidationInfo) -> int:
        nodes = info.data.get("num_nodes", 1)
        if v >= nodes:
            raise ValueError(f"must be smaller than num_nodes ({nodes})")
        return v

    @field_validator("table_as_of")
    @classmethod
    def _zoned(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("needs a time zone (e.g. 2024-05-01T00:00:00Z)")
        return v

    @field_validator("storage_options", "iceberg_catalogs", mode="before")
    @classmethod
    def _json(cls, v: Any) -> Any:
        if isinstance(v, (str, bytes)):
            try:
                v = json.loads(v)
            except ValueError as e:
                raise ValueError(f"not JSON: {e}") from None
        if not isinstance(v, dict):
            raise ValueError("must be a JSON object")
        return v

    @field_validator("storage_options")
    @classmethod
    def _with_file(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        path = info.data.get("storage_options_file")
        return v if path is None else {**_json_object_file(path), **v}

    @property
    def lmdb_path(self) -> Path:
        return self.cache_dir.resolve() / "lmdb"

    @property
    def part_bytes(self) -> int:
        """Target bytes of one shard: ``unit_bytes``, but at most 1/16 of the budget (not under 64 KiB, unless
        the budget itself is smaller), so a shard fits."""
        return min(int(self.max_bytes), max(MIN_PART_BYTES, min(int(self.unit_bytes), int(self.max_bytes) // 16)))

    @property
    def staging_dir(self) -> Path:
        return self.cache_dir.resolve() / "staging"

    def public(self) -> dict[str, Any]:
        """Settings as shown over HTTP: secrets left out."""
        d = self.model_dump(mode="json")
        d["token"] = "set" if self.token else None
        d["storage_options"] = sorted(self.storage_options)
        # a catalog's properties may hold credentials: only their names are shown
        d["iceberg_catalogs"] = {n: sorted(props) for n, props in self.iceberg_catalogs.items()}
        from samplecache_service.config.redact import redact
        if self.source:
            d["source"] = redact(self.source)
        for spec in d["sources"].values():
            spec["url"] = redact(spec["url"])
        return d
