"""Epoch manifests and the leases readers hold on them."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import Response

from samplecache.service.deps import DaemonDep, TokenDep
from samplecache.service.epochs import EpochError
from samplecache.service.leases import LeaseError
from samplecache.service.models import HeartbeatIn, LeaseIn, LeaseOut, Problem

router = APIRouter(tags=["epochs"])
ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": Problem} for c in (401, 404, 409, 410, 422, 503)}
Epoch = Annotated[int, Path(ge=0, le=2**62, description="Epoch number, from 0")]
LeaseId = Annotated[str, Path(min_length=1, max_length=64, pattern="^[0-9a-f]+$")]


@router.get("/v1/epochs/{epoch}", responses={200: {"description": "The sealed manifest (JSON)"}, **ERRORS})
async def get_epoch(d: DaemonDep, epoch: Epoch,
                    min_samples: Annotated[int, Query(ge=0, le=2**62, description="Wait until the cache holds this many samples before sealing")] = 1,
                    timeout: Annotated[float, Query(ge=0, le=3600, description="Longest wait for min_samples (s)")] = 30.0,
                    max_samples: Annotated[int | None, Query(ge=0, le=2**62, description="Cap on this epoch's samples (default: --epoch-max-samples)")] = None,
                    format: Annotated[Literal["json", "compact"], Query(description="compact: the shard table packed as `shards_packed` (what the client uses)")] = "json") -> Response:
    """The manifest of ``epoch``. The first call seals it from the shards resident now."""
    if d.schema is None and d.catalog.manifest_bytes(epoch) is None:
        raise HTTPException(503, f"the source is not discovered yet: {d.last_error or 'discovering'}",
                            headers={"Retry-After": "2"})
    try:
        raw = await d.epochs.manifest(epoch, min_samples, timeout, max_samples)
    except EpochError as e:
        headers = {"Retry-After": str(int(e.retry_after))} if e.retry_after else None
        raise HTTPException(e.status, e.message, headers=headers) from None
    if format == "compact":
        raw = await asyncio.to_thread(d.catalog.compact_manifest, epoch) or raw
    return Response(raw, media_type="application/json")


def _lease_error(e: LeaseError) -> HTTPException:
    return HTTPException(e.status, e.message)


@router.post("/v1/epochs/{epoch}/leases", response_model=LeaseOut, status_code=201, responses=ERRORS,
             dependencies=[TokenDep])
async def take_lease(d: DaemonDep, epoch: Epoch, body: LeaseIn | None = None) -> Any:
    """Pin every shard of a sealed epoch until the lease is released or expires."""
    if epoch not in d.catalog.epochs():
        raise HTTPException(404, f"epoch {epoch} is not sealed: GET /v1/epochs/{epoch} first")
    body = body or LeaseIn()
    if body.job is not None:
        if body.run is None or body.job_epoch is None:
            raise HTTPException(422, "a lease for a job needs its run and job_epoch too")
        job = d.jobs.job(body.job, body.run)  # 404 for an unknown job, 409 for a replaced run
        if job.epochs.get(body.job_epoch) != epoch:
            raise HTTPException(409, f"job {body.job!r} epoch {body.job_epoch} does not read daemon epoch {epoch}: "
                                     f"POST /v1/jobs/{body.job}/epochs/{body.job_epoch} says which it reads")
    try:
        lease = d.leases.take(epoch, body.ttl, body.holder, body.job, body.run, body.job_epoch)
    except LeaseError as e:
        raise _lease_error(e) from None
    # Checked on the writer thread, after any eviction already under way: from here on the lease pins them.
    missing = await asyncio.wrap_future(d.writer.submit(lambda txn: d.missing_shards(epoch)))
    if missing:
        d.leases.release(epoch, lease.id)
        raise HTTPException(410, f"epoch {epoch} can no longer be read: {missing} of its shards were evicted "
                                 f"(it had no live lease); read a newer epoch")
    d.persist_leases()  # queued on the writer; the reader does not wait for the disk
    return lease.to_json()


@router.post("/v1/epochs/{epoch}/leases/{lease_id}/heartbeat", response_model=LeaseOut, responses=ERRORS,
             dependencies=[TokenDep])
async def heartbeat(d: DaemonDep, epoch: Epoch, lease_id: LeaseId, body: HeartbeatIn | None = None) -> Any:
    """Keep the lease alive; ``read`` reports the samples its reader has read."""
    lease = d.leases.get(lease_id)
    if lease is not None and lease.job is not None:
        d.jobs.job(lease.job, lease.run)  # a replaced run is told so (409)
    try:
        return d.leases.heartbeat(epoch, lease_id, (body or HeartbeatIn()).read).to_json()
    except LeaseError as e:
        raise _lease_error(e) from None


@router.delete("/v1/epochs/{epoch}/leases/{lease_id}", status_code=204, responses=ERRORS, dependencies=[TokenDep])
async def release(d: DaemonDep, epoch: Epoch, lease_id: LeaseId,
                  read: Annotated[int | None, Query(ge=0, le=2**62, description="Samples its reader read")] = None) -> Response:
    try:
        lease = d.leases.release(epoch, lease_id, read)
    except LeaseError as e:
        raise _lease_error(e) from None
    d.lease_ended(lease)
    d.persist_leases()
    return Response(status_code=204)
