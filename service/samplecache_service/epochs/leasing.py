"""Taking a lease: the epoch and job checks, then the race with eviction settled on the writer thread."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable

from samplecache_service.epochs.jobs import JobTable
from samplecache_service.epochs.leases import Lease, LeaseTable
from samplecache_service.epochs.manager import EpochManager
from samplecache_service.errors import Conflict, Gone, NotFound
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.writer import Writer


class Leasing:
    def __init__(self, catalog: Catalog, epochs: EpochManager, leases: LeaseTable, jobs: JobTable, writer: Writer,
                 persist: Callable[[], Future[None]]) -> None:
        """``persist``: queue the lease and job tables for the disk (``Daemon.persist_leases``)."""
        self.catalog, self.epochs, self.leases, self.jobs, self.writer = catalog, epochs, leases, jobs, writer
        self.persist = persist

    def missing_shards(self, epoch: int) -> int:
        """How many shards of ``epoch`` are no longer resident."""
        return sum(1 for sid in self.epochs.shard_ids(epoch) if self.catalog.shard(sid) is None)

    def take(self, epoch: int, ttl: float | None = None, holder: str | None = None, job: str | None = None,
             run: str | None = None, job_epoch: int | None = None) -> Future[Lease]:
        """A lease on sealed ``epoch`` that pins every one of its shards, or an error: NotFound (not sealed), Gone
        (no longer kept, or a shard was evicted before the lease could pin it), Conflict (the job's epoch reads
        another daemon epoch, or its run was replaced)."""
        if epoch not in self.catalog.epochs():
            if epoch <= self.epochs.last_sealed():
                raise Gone(f"epoch {epoch} is no longer kept (--epochs-kept): read a newer epoch")
            raise NotFound(f"epoch {epoch} is not sealed: GET /v1/epochs/{epoch} first")
        # the job's three fields come together (LeaseIn checks)
        if job is not None and run is not None and job_epoch is not None:
            # 404 for an unknown job, 409 for a replaced run
            mapped = self.jobs.job(job, run)
            if mapped.epochs.get(job_epoch) != epoch:
                raise Conflict(f"job {job!r} epoch {job_epoch} does not read daemon epoch {epoch}: "
                               f"POST /v1/jobs/{job}/epochs/{job_epoch} says which it reads")
        lease = self.leases.take(epoch, ttl, holder, job, run, job_epoch)
        taken: Future[Lease] = Future()

        def settled(check: Future[Any]) -> None:
            # Checked on the writer thread, after any eviction already under way: from here on the lease pins them.
            try:
                missing = check.result()
            except BaseException as e:
                self.leases.release(epoch, lease.id)
                taken.set_exception(e)
                return
            if missing:
                self.leases.release(epoch, lease.id)
                taken.set_exception(Gone(f"epoch {epoch} can no longer be read: {missing} of its shards were "
                                         f"evicted (it had no live lease); read a newer epoch"))
                return
            # queued on the writer; the reader does not wait for the disk
            self.persist()
            taken.set_result(lease)

        self.writer.submit(lambda txn: self.missing_shards(epoch)).add_done_callback(settled)
        return taken
