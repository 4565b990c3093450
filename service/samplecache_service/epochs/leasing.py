"""Leasing: taking a lease (the epoch and job checks, then the race with eviction settled on the writer thread),
its heartbeats and its end, and what of it goes to disk: one record per lease, and the job table."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any, Callable, Iterable

from samplecache_service.epochs.jobs import JobTable
from samplecache_service.epochs.leases import Lease, LeaseTable
from samplecache_service.epochs.manager import EpochManager
from samplecache_service.errors import Conflict, Gone, NotFound
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.writer import Writer

log = logging.getLogger("samplecache.daemon")
MISSING_KEPT = 64  # epochs whose missing-shard counts are kept


class Leasing:
    def __init__(self, catalog: Catalog, epochs: EpochManager, leases: LeaseTable, jobs: JobTable,
                 writer: Writer) -> None:
        self.catalog, self.epochs, self.leases, self.jobs, self.writer = catalog, epochs, leases, jobs, writer
        self._missing: dict[int, tuple[int, int]] = {}  # epoch -> (catalog.removals, its missing shards) then
        leases.load(catalog.saved_leases)
        if catalog.legacy_leases:
            # a cache written before per-lease records: its one-blob table becomes records
            writer.put_leases({l.id: l.to_json() for l in leases.live()}, drop_legacy=True)
        if catalog.legacy_jobs:  # and its one-blob job table (loaded as all changed) becomes a record per job
            self.save_jobs()

    def _changed_jobs(self) -> tuple[Callable[[], dict[str, Any]], Callable[[], None]]:
        """(take, failed), both run on the writer thread: ``take`` the changed jobs' records (a later snapshot
        never lands first); ``failed``: the commit failed, so the next save writes them (it runs after this)."""
        taken: dict[str, Any] = {}

        def take() -> dict[str, Any]:
            taken.update(self.jobs.take_changes())
            return taken
        return take, lambda: self.jobs.unsaved(taken)

    def save_jobs(self) -> Future[None]:
        """Queue the jobs changed since their last save for the disk, a record each."""
        take, failed = self._changed_jobs()
        return self.writer.put_jobs(take, failed)

    def of_job(self, job: str) -> list[Lease]:
        """The live leases of ``job``'s readers."""
        return [l for l in self.leases.live() if l.job == job]

    def expired_for(self, job: str, job_epoch: int) -> Lease | None:
        """The latest recently expired lease of ``job`` on its epoch ``job_epoch``, if any."""
        return self.leases.expired_for(job, job_epoch)

    def missing_shards(self, epoch: int) -> int:
        """How many shards of ``epoch`` are no longer resident. Asked by every rank and worker that maps a job's
        epoch, on the event loop: counted again only once a shard went (100k shards: 2 ms searched in the id
        column, 34 ms looked up one by one), else the count kept."""
        seen = self.catalog.removals  # read first: a removal while counting makes the next call count again
        kept = self._missing.get(epoch)
        if kept is not None and kept[0] == seen:
            return kept[1]
        ids = self.epochs.named_ids(epoch)
        n = len(ids) - self.catalog.resident_count(ids)
        if len(self._missing) >= MISSING_KEPT:
            self._missing.clear()
        self._missing[epoch] = (seen, n)
        return n

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
            self.epochs.read_started(epoch)
            if job is not None and job_epoch is not None:
                self.jobs.lease_taken(job, job_epoch)
            # queued on the writer; the reader does not wait for the disk
            self.writer.put_leases({lease.id: lease.to_json()})
            taken.set_result(lease)

        self.writer.submit(lambda txn: self.missing_shards(epoch)).add_done_callback(settled)
        return taken

    def heartbeat(self, epoch: int, lease_id: str, read: int | None = None,
                  read_sources: dict[str, int] | None = None) -> Lease:
        """Keep a lease alive (not written to disk: a restart gives every saved lease a fresh TTL)."""
        lease = self.leases.get(lease_id)
        if lease is not None and lease.job is not None:
            self.jobs.job(lease.job, lease.run)  # a replaced run is told so (409)
        return self.leases.heartbeat(epoch, lease_id, read, read_sources)

    def release(self, epoch: int, lease_id: str, read: int | None = None,
                read_sources: dict[str, int] | None = None) -> Lease:
        lease = self.leases.release(epoch, lease_id, read, read_sources)
        self.ended([lease])
        return lease

    def expire(self) -> None:
        """Forget the leases whose readers stopped heartbeating, and the jobs left with none for a TTL."""
        gone = self.leases.expire()
        for lease in gone:
            log.info("lease %s on epoch %d expired (job %s): its reader stopped heartbeating", lease.id, lease.epoch,
                     lease.job, extra={"event": "lease_expired", "lease": lease.id, "epoch": lease.epoch,
                                       "job": lease.job})
        self.ended(gone)
        if self.jobs.expire(self.leases.jobs()):
            self.save_jobs()

    def ended(self, leases: Iterable[Lease]) -> None:
        """Leases were released or expired: their readers' samples count for their jobs' epochs, and their
        records go, with the job table, in one commit. A lease of the newest epoch that ends with nothing read
        was taken ahead (a worker fetched the next epoch, then exited): that epoch stays pinned for PIN_GRACE_S,
        the hand-over to the workers that read it. Any other lease unpins at once: an older epoch handed back
        unread is one the job went past, and holding it would only stall sampling."""
        records: dict[str, dict[str, Any] | None] = {}
        newest = self.epochs.last_sealed()
        for lease in leases:
            self.jobs.add_read(lease.job, lease.job_epoch, lease.read, lease.read_sources)
            records[lease.id] = None
            if lease.read == 0 and lease.epoch == newest:
                self.epochs.hold(lease.epoch)
        if records:
            take, failed = self._changed_jobs()
            self.writer.put_leases(records, jobs=take, failed=failed)
