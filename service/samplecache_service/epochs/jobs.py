"""Jobs: each training run's own epoch sequence on the one shared daemon.

A job is one training run (every rank and DataLoader worker of it, on every
host). Its epochs 0, 1, 2... are its own: job epoch ``e`` maps to a daemon epoch
sealed when the job first asked for ``e``, so a job that starts on a warm,
rolling daemon begins with the current sample whatever the daemon's global epoch
count is. Every process of one run attaches with the same ``run`` id (the client
agrees on it over torch.distributed and hands it to its workers), so they all
see one mapping.

A job name belongs to one run at a time. A new run under an existing name takes
the job over and continues its epoch sequence (a restart); the run it replaced
is told so (409) on its next request, so two live runs never read one job's
epochs twice without an error. A job with no live lease and no request for the
lease TTL expires: what it pinned is released, its record stays for a restart by
name.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from samplecache_service.errors import Conflict, NotFound, ServiceError

log = logging.getLogger("samplecache.jobs")

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
RUN_PATTERN = r"^[0-9a-f]{8,32}$"
JOBS_KEPT = 200  # expired jobs beyond this are forgotten, oldest first
EPOCHS_KEPT = 100  # per job: older epoch mappings are forgotten
SUPERSEDED_KEPT = 16
# How long a new epoch (a job's mapping, a fresh seal) pins its shards before its first lease: the gap between a
# reader getting the manifest and leasing it (DataLoader workers starting: spawn and import torch, 10 s and more on
# a busy host). Capped by the lease TTL; a lease taken ends it at once.
PIN_GRACE_S = 30.0


@dataclass
class Job:
    name: str
    run: str
    created_at: float
    last_seen: float
    start_epoch: int = 0  # the first job epoch of the current run
    runs: int = 1  # runs that have attached under this name
    epochs: dict[int, int] = field(default_factory=dict)  # job epoch -> daemon epoch
    # job epoch -> when it was mapped, until a lease on it is taken (the mapping's own pin: see recently_mapped)
    mapped_at: dict[int, float] = field(default_factory=dict)
    read: dict[int, int] = field(default_factory=dict)  # job epoch -> samples read by ended leases
    read_sources: dict[int, dict[str, int]] = field(default_factory=dict)  # the same, per source (mixtures)
    # job epoch -> the mixture its readers read: {"mixture", "mix", "epoch_samples", "counts"} (PUT by the client)
    mixtures: dict[int, dict[str, Any]] = field(default_factory=dict)
    superseded: list[str] = field(default_factory=list)  # earlier runs, which may no longer read
    expired: bool = False

    def last_epoch(self) -> int:
        return max(self.epochs, default=-1)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in _BY_EPOCH:
            d[k] = {str(e): v for e, v in d[k].items()}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Job":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}  # saved by another version
        for k in _BY_EPOCH:
            d[k] = {int(e): v for e, v in (d.get(k) or {}).items()}
        return cls(**d)


_BY_EPOCH = ("epochs", "mapped_at", "read", "read_sources", "mixtures")  # Job fields keyed by job epoch


class JobTable:
    """Thread-safe table of jobs. Persisted by the caller, a record per job (``take_changes()`` -> the writer):
    a save writes the jobs that changed since the last, not the table (up to JOBS_KEPT jobs of EPOCHS_KEPT
    epochs each, rewritten on every epoch of every job, would make each save slower the longer the daemon runs)."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.time) -> None:
        self.ttl, self.clock = ttl, clock
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._mapping: dict[str, asyncio.Lock] = {}
        self._changed: set[str] = set()  # names of the jobs changed (or forgotten) since their last save

    def lock(self, name: str) -> asyncio.Lock:
        """The event loop's lock for mapping ``name``'s epochs (its ranks and workers ask at once)."""
        return self._mapping.setdefault(name, asyncio.Lock())

    def load(self, saved: Iterable[dict[str, Any]], changed: bool = False) -> None:
        """Jobs saved by an earlier run of the daemon; live ones get a fresh TTL (their trainers reconnect).
        ``changed``: every one is saved again by the next save (read from the one-blob table of older versions)."""
        now = self.clock()
        with self._lock:
            for d in saved:
                job = Job.from_json(d)
                if not job.expired:
                    job.last_seen = now
                self._jobs[job.name] = job
                if changed:
                    self._changed.add(job.name)

    def saved(self) -> list[dict[str, Any]]:
        """Every job's record."""
        with self._lock:
            return [j.to_json() for j in self._jobs.values()]

    def take_changes(self) -> dict[str, dict[str, Any] | None]:
        """The records of the jobs changed since the last take (None: forgotten); they count as saved from now."""
        with self._lock:
            names, self._changed = self._changed, set()
            return {n: (self._jobs[n].to_json() if n in self._jobs else None) for n in names}

    def unsaved(self, names: Iterable[str]) -> None:
        """Jobs taken by a save whose commit failed: the next save writes them (as they are then)."""
        with self._lock:
            self._changed.update(names)

    def _unknown(self, name: str) -> ServiceError:
        known = sorted(self._jobs)
        shown = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
        return NotFound(f"no job named {name!r}; known jobs: {shown or 'none'}", known=known[:100])

    # -- runs --------------------------------------------------------------------------------
    def attach(self, name: str, run: str, resume: bool = False) -> Job:
        """The job ``name`` for ``run``: created, joined (same run) or taken over (a new run continues it).
        ``resume``: the job must exist (a restart from saved state)."""
        now = self.clock()
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                if resume:
                    raise self._unknown(name)
                job = self._jobs[name] = Job(name=name, run=run, created_at=now, last_seen=now)
                self._changed.add(name)
                self._trim()
                log.info("job %s: started", name, extra={"event": "job_started", "job": name})
                return job
            if run == job.run:
                if job.expired:
                    self._changed.add(name)
                job.last_seen, job.expired = now, False
                return job
            if run in job.superseded:
                raise self._taken_over(job)
            log.warning("job %s: a new run takes it over at job epoch %d (the previous run, if still alive, "
                        "gets 409 on its next request)", name, job.last_epoch() + 1,
                        extra={"event": "job_taken_over", "job": name, "epoch": job.last_epoch() + 1})
            job.superseded = (job.superseded + [job.run])[-SUPERSEDED_KEPT:]
            job.run, job.runs = run, job.runs + 1
            job.start_epoch = job.last_epoch() + 1
            job.last_seen, job.expired = now, False
            self._changed.add(name)
            return job

    @staticmethod
    def _taken_over(job: Job) -> ServiceError:
        return Conflict(f"job {job.name!r} was taken over by a newer run (a restart or another trainer with "
                             f"the same job name): two runs cannot share a job; give this one another job name")

    def job(self, name: str, run: str | None = None) -> Job:
        """The job ``name``; with ``run``, checked to be its current run (409 for a replaced run)."""
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                raise self._unknown(name)
            if run is not None and run != job.run:
                if run in job.superseded:
                    raise self._taken_over(job)
                raise Conflict(f"run {run!r} has not attached to job {name!r}: POST /v1/jobs first")
            if run is not None:  # a request of the job's own run keeps it alive; an inspection does not
                if job.expired:
                    self._changed.add(name)
                job.last_seen, job.expired = self.clock(), False
            return job

    # -- epochs ------------------------------------------------------------------------------
    def map_epoch(self, name: str, job_epoch: int, daemon_epoch: int) -> None:
        now = self.clock()
        with self._lock:
            job = self._jobs.get(name)
            if job is None:  # forgotten meanwhile (an expired job beyond JOBS_KEPT)
                return
            job.epochs[job_epoch] = daemon_epoch
            job.mapped_at[job_epoch] = now
            self._changed.add(name)
            for old in sorted(job.epochs)[:-EPOCHS_KEPT]:
                job.epochs.pop(old, None)
                job.mapped_at.pop(old, None)
                job.read.pop(old, None)
                job.read_sources.pop(old, None)
                job.mixtures.pop(old, None)

    def add_read(self, name: str | None, job_epoch: int | None, samples: int,
                 by_source: dict[str, int] | None = None) -> None:
        """Samples read by a lease that ended (released or expired), in all and per source."""
        if name is None or job_epoch is None or samples <= 0:
            return
        with self._lock:
            job = self._jobs.get(name)
            if job is not None:
                self._changed.add(name)
                job.read[job_epoch] = job.read.get(job_epoch, 0) + samples
                if by_source:
                    got = job.read_sources.setdefault(job_epoch, {})
                    for source, n in by_source.items():
                        got[source] = got.get(source, 0) + int(n)

    def set_mixture(self, name: str, run: str | None, job_epoch: int, record: dict[str, Any]) -> None:
        """Record the mixture job epoch ``job_epoch`` reads (its readers all send the same; the first stays)."""
        job = self.job(name, run)
        with self._lock:
            if job_epoch not in job.epochs:
                raise NotFound(f"job {name!r} has no epoch {job_epoch} mapped: map it first "
                               f"(POST /v1/jobs/{name}/epochs/{job_epoch})")
            if job_epoch not in job.mixtures:
                job.mixtures[job_epoch] = dict(record)
                self._changed.add(name)

    def lease_taken(self, name: str, job_epoch: int) -> None:
        """A reader of the job's epoch took its lease: the lease pins the epoch now, the mapping no longer."""
        with self._lock:
            job = self._jobs.get(name)
            if job is not None and job.mapped_at.pop(job_epoch, None) is not None:
                self._changed.add(name)

    def recently_mapped(self) -> set[int]:
        """Daemon epochs a live job mapped within the last PIN_GRACE_S (at most the TTL) and no reader has leased
        yet: pinned while its readers start and take their leases. Pins follow readers: once leased, the leases
        pin it, and their release unpins it at once (a mapping does not hold the cache for a TTL)."""
        now = self.clock()
        grace = min(self.ttl, PIN_GRACE_S)
        with self._lock:
            return {job.epochs[e] for job in self._jobs.values() if not job.expired
                    for e, t in job.mapped_at.items() if now - t < grace and e in job.epochs}

    def mapped(self) -> set[int]:
        """Daemon epochs the jobs that have not expired map their epochs to (kept while they may resume)."""
        with self._lock:
            return {de for job in self._jobs.values() if not job.expired for de in job.epochs.values()}

    def expire(self, leased: set[str]) -> list[Job]:
        """Jobs with no live lease (names in ``leased`` have one) and no request for the TTL expire."""
        now = self.clock()
        gone = []
        with self._lock:
            for job in self._jobs.values():
                if not job.expired and job.name not in leased and now - job.last_seen > self.ttl:
                    job.expired = True
                    self._changed.add(job.name)
                    gone.append(job)
        for job in gone:
            log.info("job %s: expired (no lease and no request for %.0fs); what it pinned is released",
                     job.name, self.ttl, extra={"event": "job_expired", "job": job.name})
        return gone

    def _trim(self) -> None:
        if len(self._jobs) <= JOBS_KEPT:
            return
        old = sorted((j for j in self._jobs.values() if j.expired), key=lambda j: j.last_seen)
        for job in old[:len(self._jobs) - JOBS_KEPT]:
            del self._jobs[job.name]
            self._changed.add(job.name)  # its record goes

    def all(self) -> list[Job]:
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.created_at)

    def active(self) -> int:
        with self._lock:
            return sum(1 for j in self._jobs.values() if not j.expired)
