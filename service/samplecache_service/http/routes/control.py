"""Inspecting and steering the cache: shards, samplers, runtime config."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import ByteSize, TypeAdapter, ValidationError

from samplecache.format.constants import MAX_NUMBER
from samplecache_service.config.redact import redact
from samplecache_service.config.settings import SourceSpec, resolve_sources
from samplecache_service.errors import Conflict, Invalid
from samplecache_service.http.deps import DaemonDep, TokenDep
from samplecache_service.http.models import (
    REMOTE_PROTOCOLS,
    REMOTE_URL,
    SOURCE_NAME,
    ConfigIn,
    ConfigOut,
    SamplerControl,
    ShardPage,
    problems,
)

router = APIRouter(tags=["control"])
_SIZE = TypeAdapter(ByteSize)


@router.get("/v1/shards", response_model=ShardPage, responses=problems(422))
async def shards(d: DaemonDep, offset: Annotated[int, Query(ge=0, le=MAX_NUMBER)] = 0,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
    """Resident shards, oldest first."""
    all_shards = d.catalog.shards()
    pinned = d.epochs.pinned_shards()
    page = all_shards[offset:offset + limit]
    return {"total": len(all_shards), "offset": offset, "limit": limit,
            "shards": [{"id": s.id, "source": s.source, "path": redact(s.path), "row_group": s.row_group,
                        "row_groups": s.row_groups,
                        "first_row": s.first_row, "rows": s.rows, "bytes": s.bytes,
                        "partitions": d.catalog.file(s.path).partitions,
                        "created": s.created, "last_used_epoch": s.last_used_epoch, "pinned": s.id in pinned}
                       for s in page]}


def _control(d: Any) -> dict[str, Any]:
    return {"paused": d.user_paused, "state": d.scheduler.state()}


@router.post("/v1/samplers/pause", response_model=SamplerControl, responses=problems(401, 413),
             dependencies=[TokenDep])
async def pause(d: DaemonDep) -> Any:
    await asyncio.wrap_future(d.set_paused(True))
    return _control(d)


@router.post("/v1/samplers/resume", response_model=SamplerControl, responses=problems(401, 413),
             dependencies=[TokenDep])
async def resume(d: DaemonDep) -> Any:
    await asyncio.wrap_future(d.set_paused(False))
    return _control(d)


def _config(d: Any) -> dict[str, Any]:
    return {**d.runtime_config(),
            "sources": {n: {"url": s.shown, "share": s.share.fraction, "filter": d.filters.get(n)}
                        for n, s in d.sources.items()}}


def _named(body: dict[str, Any]) -> tuple[dict[str, tuple[str, float]], dict[str, str | None]]:
    """The sources a PATCH names, resolved, and their filters. errors.Conflict, naming the field, never echoing the
    value: a name that is not one, an entry that is not {url, share, filter}, a URL that is not a remote store's (a
    local or chained one could name a path on the daemon's disk), shares that do not add up."""
    specs = {}
    for name, spec in body.items():
        if not SOURCE_NAME.match(name):
            raise Conflict("sources: a source name is 1-64 characters of a-z, 0-9, _ and -")
        if not isinstance(spec, dict) or set(spec) - {"url", "share", "filter"} \
                or not isinstance(spec.get("url"), str):
            raise Conflict(f"sources.{name}: must be an object of url (a string), share (a number or null) and "
                           f"filter (a string or null)")
        got = spec.get("filter")
        if got is not None and (not isinstance(got, str) or not 0 < len(got) <= 4096):
            raise Conflict(f"sources.{name}.filter: must be a partition filter of 1-4096 characters, or null")
        share = spec.get("share")
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 < share <= 1):
            raise Conflict(f"sources.{name}.share: must be a number in (0, 1], or null")
        if not REMOTE_URL.match(spec["url"]) or "::" in spec["url"] or len(spec["url"]) > 4096:
            raise Conflict(f"sources.{name}.url: must be a remote store's URL ({', '.join(REMOTE_PROTOCOLS)}), "
                           f"not chained: a local one could name a path on the daemon's disk, which no request may; "
                           f"add such a source in the config file and reload it (SIGHUP)")
        specs[name] = SourceSpec(url=spec["url"], share=share, filter=got)
    try:
        # a source that names no filter keeps its own (a kept one) or takes --filter's (a new one)
        return resolve_sources("", specs, {}), {n: specs[n].filter for n, spec in body.items() if "filter" in spec}
    except ValueError as e:
        raise Conflict(f"sources: {e}") from None


def _size(name: str, v: int | str | None) -> int | None:
    if v is None:
        return None
    try:
        n = int(_SIZE.validate_python(v))
    except ValidationError:
        raise Invalid(f"{name}: not a size (e.g. 500GB, 2GiB, 1048576)") from None
    if n < 0:
        raise Invalid(f"{name} must not be negative")
    return n


@router.get("/v1/config", response_model=ConfigOut)
async def get_config(d: DaemonDep) -> Any:
    return _config(d)


@router.patch("/v1/config", response_model=ConfigOut, responses=problems(400, 401, 409, 413, 422),
              dependencies=[TokenDep])
async def patch_config(d: DaemonDep, body: ConfigIn) -> Any:
    """Change the budget, eviction policy, free-disk guard, epoch cap, pacing or the sources at runtime (until
    restart)."""
    if body.sources is not None:
        await asyncio.to_thread(d.set_sources, *_named(body.sources))
    await asyncio.wrap_future(d.configure(  # errors.Invalid / Conflict: mapped to statuses in api.py
        max_bytes=_size("max_bytes", body.max_bytes), policy=body.eviction_policy,
        min_free_disk=_size("min_free_disk", body.min_free_disk), epoch_max_samples=body.epoch_max_samples,
        pacing=body.pacing, replace_per_epoch=body.replace_per_epoch,
        max_ingest_rate=_size("max_ingest_rate", body.max_ingest_rate)))
    return _config(d)
