"""Jobs: each training run's own epochs on the shared daemon (see ``jobs.py``)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from samplecache.format.constants import MAX_NUMBER
from samplecache_service.epochs.jobs import NAME_PATTERN, RUN_PATTERN, Job
from samplecache_service.epochs.leasing import Leasing
from samplecache_service.epochs.manager import EpochManager
from samplecache_service.errors import Conflict, Gone, NotFound
from samplecache_service.http.deps import EpochsDep, JobsDep, LeasingDep, TokenDep
from samplecache_service.http.models import JobEpochMap, JobIn, JobOut, MixtureIn, problems

router = APIRouter(tags=["jobs"])  # errors.ServiceError raised below: mapped to statuses in api.py
Name = Annotated[str, Path(pattern=NAME_PATTERN, description="The job's name")]
JobEpoch = Annotated[int, Path(ge=0, le=MAX_NUMBER, description="The job's epoch number, from 0")]
EPOCHS_SHOWN = 20


def job_out(leasing: Leasing, epochs: EpochManager, job: Job) -> dict[str, Any]:
    leases = leasing.of_job(job.name)
    summaries = {str(e): v for e, v in epochs.summaries().items()}
    rows = []
    for e in sorted(job.epochs)[-EPOCHS_SHOWN:]:
        de = job.epochs[e]
        mine = [l for l in leases if l.job_epoch == e]
        by_source = dict(job.read_sources.get(e, {}))
        for lease in mine:
            for source, n in lease.read_sources.items():
                by_source[source] = by_source.get(source, 0) + n
        rows.append({"job_epoch": e, "daemon_epoch": de, "samples": summaries.get(str(de), {}).get("samples"),
                     "samples_read": job.read.get(e, 0) + sum(l.read for l in mine), "leases": len(mine),
                     "mixture": job.mixtures.get(e), "samples_read_by_source": by_source})
    state = "reading" if leases else ("expired" if job.expired else "idle")
    return {"name": job.name, "state": state, "created_at": job.created_at, "last_seen": job.last_seen,
            "last_heartbeat": max((l.expires_at - l.ttl for l in leases), default=None),
            "start_epoch": job.start_epoch, "next_epoch": job.last_epoch() + 1, "runs": job.runs,
            "samples_read": sum(job.read.values()) + sum(l.read for l in leases),
            "leases": [{"epoch": l.epoch, "job_epoch": l.job_epoch, "holder": l.holder, "read": l.read,
                        "expires_at": l.expires_at} for l in leases],
            "epochs": rows}


@router.post("/v1/jobs", response_model=JobOut, responses=problems(400, 401, 404, 409, 413, 422),
             dependencies=[TokenDep])
async def attach(jobs: JobsDep, leasing: LeasingDep, epochs: EpochsDep, body: JobIn) -> Any:
    """Start a job, join it (another process of the same run) or take it over (a new run of the same name
    continues its epoch sequence). ``resume``: the job must exist."""
    job = jobs.attach(body.name, body.run, body.resume)
    leasing.save_jobs()
    return job_out(leasing, epochs, job)


@router.get("/v1/jobs", response_model=list[JobOut])
async def jobs(jobs: JobsDep, leasing: LeasingDep, epochs: EpochsDep) -> Any:
    """Every job the daemon knows, oldest first, with its latest epochs and live leases."""
    return [job_out(leasing, epochs, j) for j in jobs.all()]


@router.get("/v1/jobs/{name}", response_model=JobOut, responses=problems(404, 422))
async def job(jobs: JobsDep, leasing: LeasingDep, epochs: EpochsDep, name: Name) -> Any:
    return job_out(leasing, epochs, jobs.job(name))


def _replayable(leasing: Leasing, epochs: EpochManager, daemon_epoch: int) -> int:
    """``daemon_epoch`` if it is sealed and every shard it names is still resident."""
    if daemon_epoch not in epochs.sealed():
        raise NotFound(f"daemon epoch {daemon_epoch} is not sealed (GET /v1/status lists the epochs)")
    missing = leasing.missing_shards(daemon_epoch)
    if missing:
        raise Gone(f"daemon epoch {daemon_epoch} can no longer be read: {missing} of its shards were "
                   f"evicted (it had no live lease); replay a newer epoch")
    return daemon_epoch


def _gone(leasing: Leasing, job: Job, job_epoch: int, daemon_epoch: int, missing: int) -> Gone:
    nxt = job_epoch + 1
    while nxt in job.epochs and leasing.missing_shards(job.epochs[nxt]):
        nxt += 1
    lease = leasing.expired_for(job.name, job_epoch)
    why = (f"its lease expired {time.time() - lease.expires_at:.0f} s ago and" if lease is not None
           else "it had no live lease and")
    return Gone(f"job {job.name!r} epoch {job_epoch} (daemon epoch {daemon_epoch}) can no longer be read: "
                f"{why} {missing} of its shards were evicted since; continue at the job's next epoch: "
                f"ds.set_epoch({nxt}) (samplecache.EpochGone has it as .next_epoch)", next_epoch=nxt)


@router.put("/v1/jobs/{name}/epochs/{job_epoch}/mixture", status_code=204,
            responses=problems(400, 401, 404, 409, 413, 422),
            dependencies=[TokenDep])
async def put_mixture(jobs: JobsDep, leasing: LeasingDep, name: Name, job_epoch: JobEpoch, body: MixtureIn,
                      run: Annotated[str, Query(pattern=RUN_PATTERN, description="The job's run")]) -> Response:
    """Record the mixture the job's epoch reads and its samples per source (GET /v1/jobs/{name} shows them). Its
    readers all send the same; the first recorded stays."""
    jobs.set_mixture(name, run, job_epoch, body.model_dump())
    leasing.save_jobs()
    return Response(status_code=204)


@router.post("/v1/jobs/{name}/epochs/{job_epoch}", response_model=JobEpochMap,
             responses=problems(401, 404, 409, 410, 413, 422, 503),
             dependencies=[TokenDep])
async def map_epoch(jobs: JobsDep, leasing: LeasingDep, epochs: EpochsDep, name: Name, job_epoch: JobEpoch,
                    run: Annotated[str, Query(pattern=RUN_PATTERN, description="The job's run")],
                    min_samples: Annotated[int, Query(ge=0, le=MAX_NUMBER, description="Wait until the cache holds "
                                                      "this many samples before sealing")] = 1,
                    timeout: Annotated[float, Query(ge=0, le=3600,
                                                    description="Longest wait for min_samples (s)")] = 30.0,
                    max_samples: Annotated[int | None, Query(ge=0, le=MAX_NUMBER, description="Cap on the epoch's "
                                                             "samples (default: --epoch-max-samples)")] = None,
                    daemon_epoch: Annotated[int | None,
                                            Query(ge=0, le=MAX_NUMBER, description="Replay this sealed daemon epoch "
                                                  "as the job's epoch (a snapshot)")] = None) -> Any:
    """The daemon epoch that the job's epoch reads: the first request seals a new one from the shards resident
    now (or maps the sealed ``daemon_epoch`` asked for); every later request of the job (any rank, worker or
    host) gets the same. 410 when its shards were evicted (its leases ended), with ``next_epoch`` to go on at."""
    mapped = jobs.job(name, run).epochs.get(job_epoch)  # 404 / 409 before waiting for the lock
    if mapped is not None and daemon_epoch in (None, mapped) and not jobs.lock(name).locked():
        # mapped already, and no mapping of the job under way (a mapping holds the lock until it is on disk):
        # every rank and worker after the first asks this, none of them queues
        missing = leasing.missing_shards(mapped)
        if missing:
            raise _gone(leasing, jobs.job(name, run), job_epoch, mapped, missing)
        return {"job": name, "job_epoch": job_epoch, "daemon_epoch": mapped,
                "samples": epochs.summary(mapped).get("samples", 0)}
    async with jobs.lock(name):  # one mapping at a time per job: its ranks and workers ask at once
        job = jobs.job(name, run)  # again: the job may have been taken over while this request waited
        mapped = job.epochs.get(job_epoch)
        if daemon_epoch is not None and mapped not in (None, daemon_epoch):
            raise Conflict(f"job {name!r} epoch {job_epoch} already reads daemon epoch {mapped}, not "
                           f"{daemon_epoch}: replay it as another job epoch")
        if mapped is None:
            if daemon_epoch is not None:
                mapped = _replayable(leasing, epochs, daemon_epoch)
            else:
                mapped = await epochs.seal_new(min_samples, timeout, max_samples)  # 503 before discovery
                jobs.job(name, run)  # and after a long warm-up
            jobs.map_epoch(name, job_epoch, mapped)
            await asyncio.wrap_future(leasing.save_jobs())  # on disk before any process reads it
        else:
            missing = leasing.missing_shards(mapped)
            if missing:
                raise _gone(leasing, job, job_epoch, mapped, missing)
    samples = epochs.summary(mapped).get("samples", 0)
    return {"job": name, "job_epoch": job_epoch, "daemon_epoch": mapped, "samples": samples}
