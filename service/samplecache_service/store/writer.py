"""The one LMDB writer. Every write transaction of the daemon runs here, on one thread.

Callers submit operations and get a ``concurrent.futures.Future``; the event loop
awaits them with ``asyncio.wrap_future`` and never blocks on LMDB.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import lmdb
import numpy as np

from samplecache.format.manifest import Manifest
from samplecache.format.record import record_key, verify_block
from samplecache_service.config.settings import DEFAULT_SOURCE
from samplecache_service.store.catalog import (
    JOB_PREFIX,
    LEASE_PREFIX,
    SUMMARY_PREFIX,
    Catalog,
    Shard,
    source_key,
    u64,
)
from samplecache_service.store.disk import out_of_space
from samplecache_service.store.eviction import EvictionPlan, MakeRoom
from samplecache_service.store.fileinfo import FileInfo
from samplecache_service.store.staging import StagingError, read_staged

log = logging.getLogger("samplecache.writer")



class NoRoom(Exception):
    """A shard does not fit: the room left is pinned by leases. The staging file stays."""

    def __init__(self, size: int, plan: EvictionPlan) -> None:
        super().__init__(f"a shard of {size} bytes does not fit: only {plan.freed} bytes are evictable")
        self.size, self.plan = size, plan


class DamagedShard(Exception):
    """A staged shard whose block ``block`` fails its check (``reason``): nothing of it is ingested. The staging
    file stays where it is for the caller to set aside or drop; its unit should be sampled again."""

    def __init__(self, path: Path, block: int, reason: str) -> None:
        super().__init__(f"staged shard {path.name} is damaged: block {block}: {reason}")
        self.path, self.block, self.reason = path, block, reason


class Ingested(NamedTuple):
    shard: Shard | None
    evicted: tuple[int, ...]


class Writer:
    """Owns the write side of the environment."""

    def __init__(self, env: lmdb.Environment, dbs: dict[bytes, Any], catalog: Catalog) -> None:
        self.env = env
        self.dbs = dbs
        self.catalog = catalog
        self._q: queue.Queue[
            tuple[Callable[[lmdb.Transaction], Any], Callable[[Any], None] | None, Future[Any],
                  Callable[[], bool] | None, Callable[[], None] | None] | None
        ] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="samplecache-writer", daemon=True)
        self.commits = 0
        # what GET /metrics counts (since start): shards ingested, and shards evicted by reason (ingest: to make
        # room for a new shard; config: the budget or the policy changed)
        self.ingested = {"shards": 0, "rows": 0, "bytes": 0}
        self.evicted: Counter[str] = Counter()
        self.evicted_bytes: Counter[str] = Counter()
        self.observe_ingest: Callable[[float], None] = lambda seconds: None  # seconds from ingest() to commit
        self._thread.start()

    # -- the thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            op, after, fut, on_full, failed = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = self._run(op, on_full)
                if after is not None:
                    after(result)
                fut.set_result(result)
            except BaseException as e:  # reported to the caller; the writer keeps going
                if failed is not None:
                    failed()  # here, before the next operation runs (a callback on the future could come after)
                fut.set_exception(e)

    def _commit(self, op: Callable[[lmdb.Transaction], Any]) -> Any:
        with self.env.begin(write=True) as txn:
            result = op(txn)
        self.commits += 1
        return result

    def _run(self, op: Callable[[lmdb.Transaction], Any], on_full: Callable[[], bool] | None) -> Any:
        try:
            return self._commit(op)
        except Exception as e:
            if not out_of_space(e):
                raise
            # LMDB reuses the pages a commit freed only once a later commit is made: retried as it is, a write
            # that failed for want of space would be the same transaction on the same full disk, for ever
            again = on_full is not None and on_full()
            if not self.release_pages() or not again:
                raise
            return self._commit(op)

    def release_pages(self) -> bool:
        """Commit one tiny transaction, so that the next write can reuse the pages the last commit freed (LMDB
        keeps them for the last snapshot until then). False when even this fails for want of space."""
        try:
            self._commit(lambda txn: txn.put(b"pages_released", json.dumps(time.time()).encode(),
                                             db=self.dbs[b"meta"]))
        except Exception as e:
            if out_of_space(e):
                return False
            raise
        return True

    def submit(self, op: Callable[[lmdb.Transaction], Any], after: Callable[[Any], None] | None = None,
               on_full: Callable[[], bool] | None = None, failed: Callable[[], None] | None = None
               ) -> "Future[Any]":
        """Run ``op(txn)`` in one write transaction; ``after(result)`` runs once it has committed. When the commit
        fails for want of space, a tiny commit makes the pages the last commit freed reusable; ``on_full()``
        (on this thread, first) may free more, and returns whether ``op`` runs again at once. Without it the
        caller retries."""
        fut: Future[Any] = Future()
        self._q.put((op, after, fut, on_full, failed))
        return fut

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> bool:
        """Finish the queued operations and end the thread (waiting up to ``timeout`` s); False: it is still at
        one, so the environment must stay open."""
        self._q.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- operations ---------------------------------------------------------------------------
    def ingest(self, staged_path: Path, cursor: Callable[[int, int], dict[str, Any]] | None = None,
               make_room: MakeRoom | None = None) -> "Future[Ingested]":
        """Ingest one staging file as a new shard of the source its header names, evicting what
        ``make_room(bytes, source)`` names, in ONE transaction.

        ``cursor(cycle, unit)`` gives the sampling cursor to store with it. Raises
        NoRoom (the file stays staged) when the shard cannot fit without touching
        pinned shards, and DamagedShard when a block fails its checksum. ``shard`` is None when the file
        was already ingested.
        """
        submitted = time.monotonic()
        planned: list[EvictionPlan] = []  # the plan of the last try
        early: list[int] = []  # evicted in a commit of their own, after a try failed for want of space

        def op(txn: lmdb.Transaction) -> Ingested:
            try:
                staged = read_staged(staged_path)
            except StagingError as e:
                log.warning("dropping unreadable staging file %s: %s", staged_path.name, e,
                            extra={"event": "staging_dropped", "path": str(staged_path)})
                staged_path.unlink(missing_ok=True)
                raise  # not ingested: the caller samples its unit again (never marked done without a shard)
            try:
                h = staged.header
                if self.catalog.has_key(h["key"]):
                    return Ingested(None, ())
                for b, block in enumerate(staged.blocks):  # xxh3 at ~10 GB/s: a few ms per 64 MB shard
                    reason = verify_block(block)
                    if reason is not None:
                        raise DamagedShard(staged_path, b, reason)
                size = sum(len(b) for b in staged.blocks)
                source = str(h.get("source", DEFAULT_SOURCE))
                plan = make_room(size, source) if make_room is not None else EvictionPlan((), 0, True)
                if not plan.fits:
                    raise NoRoom(size, plan)
                planned[:] = [plan]
                self._delete(txn, plan.evict)
                sid = int(self.catalog.meta("next_shard", 1))
                records = self.dbs[b"records"]
                for b, block in enumerate(staged.blocks):
                    if not txn.put(record_key(sid, b), block, db=records, append=True):
                        raise RuntimeError(f"record key of shard {sid} block {b} exists: the catalog and the "
                                           f"records disagree (two writers on one cache?)")
                shard = Shard(id=sid, key=h["key"], path=h["path"], row_group=h["row_group"], unit=h["unit"],
                              cycle=h["cycle"], rows=h["rows"], bytes=size, rows_per_block=h["rows_per_block"],
                              blocks=len(staged.blocks), created=time.time(), row_groups=int(h.get("row_groups", 1)),
                              first_row=int(h.get("first_row", -1)), source=source)
                if not txn.put(u64(sid), shard.to_json(), db=self.dbs[b"shards"], overwrite=False):
                    raise RuntimeError(f"shard {sid} is already catalogued (two writers on one cache?)")
                txn.put(b"next_shard", json.dumps(sid + 1).encode(), db=self.dbs[b"meta"])
                if cursor is not None and h.get("final", True):  # a unit is done with its last part
                    txn.put(source_key(source, "cursor").encode(), json.dumps(cursor(h["cycle"], h["unit"])).encode(),
                            db=self.dbs[b"meta"])
                return Ingested(shard, tuple(early) + tuple(s for s in plan.evict if s not in early))
            finally:
                staged.close()

        def on_full() -> bool:
            # the pages a transaction frees are not reused within it: a shard that evicts others for its room
            # cannot be written on a full disk in one transaction. Evict first, then write it.
            evict = planned[0].evict if planned else ()
            if not evict:
                return False  # nothing more to free: the caller tries again later
            try:
                self._commit(lambda txn: self._delete(txn, evict))
            except Exception as e:
                if out_of_space(e):
                    return False
                raise
            self._removed(evict, "ingest")
            early.extend(evict)
            return True

        def after(done: Ingested) -> None:
            self._removed(done.evicted, "ingest")  # those evicted early have left the catalog: not counted twice
            if done.shard is not None:
                self.catalog.added_shard(done.shard)
                self.catalog.set_meta("next_shard", done.shard.id + 1)
                for k, v in (("shards", 1), ("rows", done.shard.rows), ("bytes", done.shard.bytes)):
                    self.ingested[k] += v
                self.observe_ingest(time.monotonic() - submitted)
            staged_path.unlink(missing_ok=True)

        return self.submit(op, after, on_full)

    def _delete(self, txn: lmdb.Transaction, shard_ids: Sequence[int]) -> None:
        records = self.dbs[b"records"]
        for sid in shard_ids:
            cur = txn.cursor(db=records)
            prefix = u64(sid)
            if cur.set_range(prefix):
                while cur.key()[:8] == prefix:
                    if not cur.delete():
                        break
            txn.delete(prefix, db=self.dbs[b"shards"])

    def put_meta(self, items: dict[str, Any] | Callable[[], dict[str, Any]]) -> "Future[None]":
        """Store meta values; ``items`` may be a callable, called on the writer thread (a snapshot taken in
        write order)."""
        got: dict[str, Any] = {}

        def op(txn: lmdb.Transaction) -> None:
            got.update(items() if callable(items) else items)
            for k, v in got.items():
                txn.put(k.encode(), json.dumps(v).encode(), db=self.dbs[b"meta"])

        def after(_: None) -> None:
            for k, v in got.items():
                self.catalog.set_meta(k, v)

        return self.submit(op, after)

    def _put_records(self, txn: lmdb.Transaction, prefix: str, changes: Mapping[str, dict[str, Any] | None]) -> None:
        db = self.dbs[b"meta"]
        for name, record in changes.items():
            key = (prefix + name).encode()
            if record is None:
                txn.delete(key, db=db)
            else:
                txn.put(key, json.dumps(record).encode(), db=db)

    def put_leases(self, changes: Mapping[str, dict[str, Any] | None], drop_legacy: bool = False,
                   jobs: Callable[[], Mapping[str, dict[str, Any] | None]] | None = None,
                   failed: Callable[[], None] | None = None) -> "Future[None]":
        """Store lease records, one key each (``None``: drop it); ``drop_legacy``: drop the old one-blob table;
        ``jobs``: job records written in the same commit (as ``put_jobs``: called on this thread); ``failed()``
        runs on this thread when the commit fails, before any later operation."""
        def op(txn: lmdb.Transaction) -> None:
            if jobs is not None:
                self._put_jobs(txn, jobs())
            self._put_records(txn, LEASE_PREFIX, changes)
            if drop_legacy:
                txn.delete(b"leases", db=self.dbs[b"meta"])

        return self.submit(op, failed=failed)

    def _put_jobs(self, txn: lmdb.Transaction, changes: Mapping[str, dict[str, Any] | None]) -> None:
        self._put_records(txn, JOB_PREFIX, changes)
        txn.delete(b"jobs", db=self.dbs[b"meta"])  # the one-blob table of older versions (its jobs are in changes)

    def put_jobs(self, changes: Callable[[], Mapping[str, dict[str, Any] | None]],
                 failed: Callable[[], None] | None = None) -> "Future[None]":
        """Store job records, one key each (``None``: drop it). ``changes`` is called on this thread: a snapshot
        taken in write order, so a later one never lands first; ``failed()`` runs on this thread when the commit
        fails, before any later operation."""
        return self.submit(lambda txn: self._put_jobs(txn, changes()), failed=failed)

    def put_files(self, files: Mapping[str, FileInfo]) -> "Future[None]":
        def op(txn: lmdb.Transaction) -> None:
            for path, info in files.items():
                txn.put(path.encode(), info.to_json(), db=self.dbs[b"files"])

        def after(_: None) -> None:
            for path, info in files.items():
                self.catalog.set_file(path, info)

        return self.submit(op, after)

    def seal(self, epoch: int, build: Callable[[], Manifest], keep_last: int = 0,
             pinned: Callable[[], set[int]] = set) -> "Future[bytes]":
        """Seal ``epoch`` with the manifest ``build()`` makes on the writer thread (so no ingest interleaves),
        stored with its shard table packed (what the client fetches, as it is).

        Its summary is written under its own key (a seal never rewrites the others). With ``keep_last`` > 0,
        older manifests beyond the last ``keep_last`` epochs are dropped unless ``pinned()`` names them."""
        summary: dict[str, Any] = {}
        named: list[np.ndarray] = []
        dropped: list[int] = []

        def op(txn: lmdb.Transaction) -> bytes:
            existing = txn.get(u64(epoch), db=self.dbs[b"epochs"])
            if existing is not None:
                return bytes(existing)
            manifest = build()
            raw = json.dumps(manifest.to_json(packed=True), separators=(",", ":")).encode()
            txn.put(u64(epoch), raw, db=self.dbs[b"epochs"])
            # each named shard is now last used by this epoch: in the catalog only (after the commit); a restart
            # reads it back from the kept manifests, so a seal never rewrites every shard's record
            named.append(manifest.table()[:, 0])
            summary.update({k: getattr(manifest, k) for k in ("samples", "new_samples", "bytes", "sealed_at",
                                                               "remote_bytes")}, shards=len(named[0]))
            meta = self.dbs[b"meta"]
            txn.put(f"{SUMMARY_PREFIX}{epoch}".encode(), json.dumps(summary).encode(), db=meta)
            txn.delete(b"epoch_summaries", db=meta)  # the one-blob form of older versions
            if keep_last > 0:
                eps = sorted(set(self.catalog.epochs()) | {epoch})
                keep = set(eps[-keep_last:]) | pinned()
                for e in eps:
                    if e not in keep:
                        txn.delete(u64(e), db=self.dbs[b"epochs"])
                        txn.delete(f"{SUMMARY_PREFIX}{e}".encode(), db=meta)
                        dropped.append(e)
            return raw

        def after(raw: bytes) -> None:
            self.catalog.sealed(epoch, raw, dict(summary) if summary else None, dropped,
                                named[0] if named else None)

        return self.submit(op, after)

    def evict(self, make_room: MakeRoom, reason: str = "config") -> "Future[tuple[int, ...]]":
        """Evict what ``make_room(0)`` names (after the budget was lowered, or files left their table), counted
        by ``reason``."""
        def op(txn: lmdb.Transaction) -> tuple[int, ...]:
            plan = make_room(0)
            self._delete(txn, plan.evict)
            return plan.evict

        def after(evicted: tuple[int, ...]) -> None:
            self._removed(evicted, reason)
            if evicted:  # so the next ingest can use the pages at once, on a full disk too
                self.release_pages()

        return self.submit(op, after)

    def _removed(self, shard_ids: Sequence[int], reason: str) -> None:
        """Evicted shards leave the catalog (after their commit), counted by ``reason``."""
        for sid in shard_ids:
            s = self.catalog.shard(sid)
            self.catalog.removed_shard(sid)
            if s is not None:
                self.evicted[reason] += 1
                self.evicted_bytes[reason] += s.bytes
