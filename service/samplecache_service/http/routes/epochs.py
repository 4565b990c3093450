"""Epoch manifests and the leases readers hold on them."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from samplecache.format.constants import MAX_NUMBER
from samplecache_service.http.deps import EpochsDep, LeasingDep, TokenDep, is_authorized
from samplecache_service.http.models import HeartbeatIn, LeaseIn, LeaseOut, problems

log = logging.getLogger("samplecache.leases")

router = APIRouter(tags=["epochs"])
WRITES = problems(400, 401, 404, 409, 410, 413, 422)
TAKES = problems(400, 401, 404, 409, 410, 413, 422, 429)  # errors.ServiceError: mapped to statuses in api.py
Epoch = Annotated[int, Path(ge=0, le=MAX_NUMBER, description="Epoch number, from 0")]
LeaseId = Annotated[str, Path(min_length=1, max_length=64, pattern="^[0-9a-f]+$")]
MANIFEST = {"description": "The sealed manifest", "content": {"application/json": {"schema": {"type": "object"}}}}


@router.get("/v1/epochs/{epoch}", responses={200: MANIFEST, **problems(404, 409, 410, 422, 503)})
async def get_epoch(epochs: EpochsDep, request: Request, epoch: Epoch,
                    min_samples: Annotated[int, Query(ge=0, le=MAX_NUMBER, description="Wait until the cache holds "
                                                      "this many samples before sealing")] = 1,
                    timeout: Annotated[float, Query(ge=0, le=3600,
                                                    description="Longest wait for min_samples (s)")] = 30.0,
                    max_samples: Annotated[int | None, Query(ge=0, le=MAX_NUMBER, description="Cap on this epoch's "
                                                             "samples (default: --epoch-max-samples)")] = None,
                    format: Annotated[Literal["json", "compact"],
                                      Query(description="compact: the shard table packed as `shards_packed` "
                                            "(what the client uses)")] = "json") -> Response:
    """The manifest of ``epoch``. The first call seals it from the shards resident now; it grants the epoch a
    share of replacement (remote traffic) only when it carries the token (or the daemon runs ``--auth off``)."""
    # errors.ServiceError: see api.py
    raw = await epochs.manifest(epoch, min_samples, timeout, max_samples, grant=is_authorized(request))
    shaped: bytes | None = await asyncio.to_thread(
        epochs.compact_manifest if format == "compact" else epochs.full_manifest, epoch)
    raw = shaped or raw
    return Response(raw, media_type="application/json")


@router.post("/v1/epochs/{epoch}/leases", response_model=LeaseOut, status_code=201, responses=TAKES,
             dependencies=[TokenDep])
async def take_lease(leasing: LeasingDep, epoch: Epoch, body: LeaseIn | None = None) -> Any:
    """Pin every shard of a sealed epoch until the lease is released or expires."""
    body = body or LeaseIn()
    lease = await asyncio.wrap_future(leasing.take(epoch, body.ttl, body.holder, body.job, body.run,
                                                     body.job_epoch))
    return lease.to_json()


@router.post("/v1/epochs/{epoch}/leases/{lease_id}/heartbeat", response_model=LeaseOut, responses=WRITES,
             dependencies=[TokenDep])
async def heartbeat(leasing: LeasingDep, epoch: Epoch, lease_id: LeaseId, body: HeartbeatIn | None = None) -> Any:
    """Keep the lease alive; ``read`` reports the samples its reader has read."""
    body = body or HeartbeatIn()
    return leasing.heartbeat(epoch, lease_id, body.read, body.read_sources).to_json()


def _per_source(raw: str | None) -> dict[str, int] | None:
    """The ``read_sources`` query: a JSON object of names -> counts. Anything else is left out (logged): it is a
    report for people, and the release itself must not fail on it."""
    if raw is None:
        return None
    try:
        got = json.loads(raw)
    except ValueError:
        got = None
    if not isinstance(got, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                            and 0 <= v <= MAX_NUMBER for k, v in got.items()):
        log.warning("a lease release's read_sources is not a JSON object of source -> samples: left out",
                    extra={"event": "bad_read_report"})
        return None
    return got


@router.delete("/v1/epochs/{epoch}/leases/{lease_id}", status_code=204, responses=WRITES, dependencies=[TokenDep])
async def release(leasing: LeasingDep, epoch: Epoch, lease_id: LeaseId,
                  read: Annotated[int | None, Query(ge=0, le=MAX_NUMBER,
                                                    description="Samples its reader read")] = None,
                  read_sources: Annotated[str | None, Query(max_length=4096, description="Of them, per source: a "
                                                            "JSON object of source name -> samples")] = None
                  ) -> Response:
    leasing.release(epoch, lease_id, read, _per_source(read_sources))
    return Response(status_code=204)
