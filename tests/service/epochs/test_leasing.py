"""Leasing on a real LMDB environment: one record per lease on disk (a take writes its own key, never the table),
records dropped when leases end, the one-blob table of older caches turned into records; one record per job, written
when it changed; and the epochs' grants of remote traffic, which only a bounded number of epochs without a reader
get."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from samplecache_service.epochs.jobs import PIN_GRACE_S, JobTable
from samplecache_service.epochs.leases import LeaseTable
from samplecache_service.epochs.leasing import Leasing
from samplecache_service.epochs.manager import UNREAD_GRANTS, EpochManager, EpochRules, build_manifest
from samplecache_service.store.budget import Budget
from samplecache_service.store.catalog import JOB_PREFIX, LEASE_PREFIX, Catalog
from samplecache_service.store.lmdbmap import open_env
from samplecache_service.store.shardtable import ShardTable
from samplecache_service.store.writer import Writer


class Cache:
    """The daemon's parts that leasing uses, on an LMDB environment under ``root``; ``reopen`` is a restart."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.open()

    def open(self) -> None:
        self.env, self.dbs = open_env(self.root / "lmdb", 1 << 26)
        self.catalog = Catalog(self.env, self.dbs)
        self.writer = Writer(self.env, self.dbs, self.catalog)
        self.leases = LeaseTable(default_ttl=60.0)
        self.jobs = JobTable(60.0)
        self.jobs.load(self.catalog.saved_jobs, changed=self.catalog.legacy_jobs)
        budget = Budget(1 << 26, 0, "fifo")
        self.epochs = EpochManager(self.catalog, self.writer, self.leases, self.jobs, budget, dict, EpochRules())
        self.leasing = Leasing(self.catalog, self.epochs, self.leases, self.jobs, self.writer)

    def close(self) -> None:
        self.writer.close()
        self.env.close()

    def reopen(self) -> None:
        self.close()
        self.open()

    def meta_keys(self) -> dict[str, Any]:
        with self.env.begin() as txn:
            return {k.decode(): json.loads(v) for k, v in txn.cursor(db=self.dbs[b"meta"])}

    def seal(self, epoch: int) -> None:
        self.writer.seal(epoch, lambda: build_manifest(epoch, ShardTable().columns(), {}, "x", 1 << 26, 0, "s3://b/",
                                                       np.zeros(0, np.int64))).result()


@pytest.fixture
def cache(tmp_path: Path) -> Any:
    c = Cache(tmp_path)
    yield c
    c.close()


def test_a_take_writes_its_own_record_and_an_end_drops_it(cache: Cache) -> None:
    cache.seal(0)
    taken = [cache.leasing.take(0, holder=f"rank {i}").result(timeout=10) for i in range(3)]
    cache.writer.submit(lambda txn: None).result()  # the records are queued behind the takes
    records = {k: v for k, v in cache.meta_keys().items() if k.startswith(LEASE_PREFIX)}
    assert records == {LEASE_PREFIX + l.id: l.to_json() for l in taken}
    assert "leases" not in cache.meta_keys()  # no table rewritten whole

    cache.leasing.release(0, taken[0].id, read=5)
    cache.writer.submit(lambda txn: None).result()
    assert LEASE_PREFIX + taken[0].id not in cache.meta_keys()

    cache.reopen()  # a restart finds the two left, with a fresh TTL
    assert sorted(l.id for l in cache.leases.live()) == sorted(l.id for l in taken[1:])


def test_the_one_blob_table_of_an_older_cache_becomes_records(cache: Cache) -> None:
    old = LeaseTable(default_ttl=60.0)
    legacy = [old.take(0, holder="old").to_json() for _ in range(2)]
    cache.writer.put_meta({"leases": legacy}).result()
    cache.reopen()
    assert sorted(l.id for l in cache.leases.live()) == sorted(d["id"] for d in legacy)
    cache.writer.submit(lambda txn: None).result()
    keys = cache.meta_keys()
    assert "leases" not in keys and {LEASE_PREFIX + d["id"] for d in legacy} <= set(keys)
    cache.reopen()  # read again from the records alone
    assert len(cache.leases.live()) == 2


def test_epochs_without_a_reader_get_a_bounded_number_of_grants(cache: Cache) -> None:
    granted: list[int] = []
    cache.epochs.on_new_epoch = granted.append
    for e in range(UNREAD_GRANTS + 3):
        cache.epochs.grant(e)
    assert granted == list(range(UNREAD_GRANTS))  # nobody leased those: the rest grant nothing
    cache.epochs.grant(0)
    assert granted == list(range(UNREAD_GRANTS))  # one grant per epoch until a reader comes
    cache.epochs.read_started(0)
    cache.epochs.grant(10)
    assert granted[-1] == 10
    cache.leases.default_ttl = 0.0  # grants older than the lease TTL no longer count
    cache.epochs.grant(11)
    assert granted[-1] == 11


def test_a_lease_spends_its_epochs_grant(cache: Cache) -> None:
    granted: list[int] = []
    cache.epochs.on_new_epoch = granted.append
    for e in range(UNREAD_GRANTS):
        cache.seal(e)
        assert cache.epochs.grant(e)
    assert not cache.epochs.grant(UNREAD_GRANTS)
    cache.leasing.take(0).result(timeout=10)  # a reader of epoch 0
    assert cache.epochs.grant(UNREAD_GRANTS) and granted[-1] == UNREAD_GRANTS


def test_a_new_epoch_is_pinned_until_its_first_lease_and_a_release_unpins_it_at_once(cache: Cache) -> None:
    cache.seal(0)
    cache.epochs._fresh[0] = time.monotonic()  # as _seal does
    cache.seal(1)
    cache.epochs._fresh[1] = time.monotonic()
    assert cache.epochs.pinned_epochs() == {0, 1}  # just sealed: pinned while their readers start
    lease = cache.leasing.take(0).result(timeout=10)
    assert cache.epochs.pinned_epochs() == {0, 1}  # 0 by its lease now
    cache.leasing.release(0, lease.id, read=5)
    assert cache.epochs.pinned_epochs() == {1}, "a released lease unpins at once: no TTL-long pin is left"
    cache.epochs._fresh[1] -= PIN_GRACE_S  # never leased: the grace ran out
    assert cache.epochs.pinned_epochs() == set()


def test_a_lease_handed_back_unread_keeps_its_epoch_pinned_briefly(cache: Cache) -> None:
    cache.seal(0)
    ahead = cache.leasing.take(0).result(timeout=10)  # a worker took the next epoch's lease ahead, then exited
    cache.leasing.release(0, ahead.id, read=0)
    assert cache.epochs.pinned_epochs() == {0}, "the workers that read it next have PIN_GRACE_S to lease it"
    lease = cache.leasing.take(0).result(timeout=10)
    cache.leasing.release(0, lease.id, read=7)  # read, then released: unpinned at once
    assert cache.epochs.pinned_epochs() == set()
    cache.seal(1)
    old = cache.leasing.take(0).result(timeout=10)
    cache.leasing.release(0, old.id, read=0)  # an older epoch handed back unread: the job went past it
    assert cache.epochs.pinned_epochs() == set(), "holding it would only stall sampling"


def test_a_lease_end_writes_its_record_and_its_jobs_record_in_one_commit(cache: Cache) -> None:
    cache.seal(0)
    cache.jobs.attach("train", "aaaa1111")
    cache.jobs.map_epoch("train", 0, 0)
    cache.leasing.save_jobs().result()
    lease = cache.leasing.take(0, job="train", run="aaaa1111", job_epoch=0).result(timeout=10)
    cache.writer.submit(lambda txn: None).result()
    commits = cache.writer.commits
    cache.leasing.release(0, lease.id, read=3)
    cache.writer.submit(lambda txn: None).result()
    assert cache.writer.commits - commits == 2  # the release, and the no-op just above
    keys = cache.meta_keys()
    assert LEASE_PREFIX + lease.id not in keys and keys[JOB_PREFIX + "train"]["read"] == {"0": 3}


def test_a_save_writes_only_the_jobs_that_changed(cache: Cache) -> None:
    for name in ("a", "b"):
        cache.jobs.attach(name, "aaaa1111")
    cache.leasing.save_jobs().result()
    written: list[str] = []
    put = cache.writer._put_records
    cache.writer._put_records = lambda txn, prefix, changes: (written.extend(changes), put(txn, prefix, changes))
    cache.jobs.map_epoch("b", 0, 4)
    cache.leasing.save_jobs().result()
    assert written == ["b"], "job a did not change: its record is not written again"
    cache.reopen()
    assert cache.jobs.job("b").epochs == {0: 4} and cache.jobs.job("a").epochs == {}


def test_a_failed_save_leaves_its_jobs_to_the_next(cache: Cache) -> None:
    cache.jobs.attach("train", "aaaa1111")
    put, calls = cache.writer._put_records, []

    def failing(txn: Any, prefix: str, changes: Any) -> None:
        calls.append(prefix)
        if len(calls) == 1:
            raise OSError("the disk failed")
        put(txn, prefix, changes)
    cache.writer._put_records = failing
    with pytest.raises(OSError):
        cache.leasing.save_jobs().result()
    assert JOB_PREFIX + "train" not in cache.meta_keys()
    cache.leasing.save_jobs().result()
    assert cache.meta_keys()[JOB_PREFIX + "train"]["run"] == "aaaa1111"


def _legacy_jobs(cache: Cache, daemon_epoch: int) -> None:
    """The one-blob job table an older version writes: jobs a and b, each with epoch 0 mapped."""
    old = JobTable(60.0)
    for name in ("a", "b"):
        old.attach(name, "aaaa1111")
        old.map_epoch(name, 0, daemon_epoch)
    cache.writer.put_meta({"jobs": old.saved()}).result()


def test_the_one_blob_job_table_of_an_older_cache_becomes_records(cache: Cache) -> None:
    _legacy_jobs(cache, 2)
    cache.reopen()
    assert sorted(j.name for j in cache.jobs.all()) == ["a", "b"]
    cache.writer.submit(lambda txn: None).result()
    keys = cache.meta_keys()
    assert "jobs" not in keys and {JOB_PREFIX + "a", JOB_PREFIX + "b"} <= set(keys)
    cache.reopen()  # read again from the records alone
    assert {j.name: j.epochs for j in cache.jobs.all()} == {"a": {0: 2}, "b": {0: 2}}


def test_a_manifest_never_names_a_shard_of_a_source_it_has_no_entry_for() -> None:
    """Each shard's source is an index into the manifest's sources: a shard of a source left out of them is a
    refusal naming it, not an index the client would misread."""
    from samplecache_service.store.catalog import Shard

    table = ShardTable()
    for sid, source in ((1, "web"), (2, "code"), (3, "math")):
        table.add(Shard(id=sid, key=f"k{sid}", path="a", row_group=0, unit=sid, cycle=0, rows=5, bytes=50,
                        rows_per_block=5, blocks=1, created=0.0, source=source))
    sources = {n: {"url": f"s3://b/{n}/"} for n in ("web", "code")}
    with pytest.raises(ValueError, match=r"source\(s\) \['math'\].*its sources: \['code', 'web'\]"):
        build_manifest(4, table.columns(), {}, "x", 1 << 26, 0, "s3://b/", np.zeros(0, np.int64), sources=sources)
    got = build_manifest(4, table.columns().take(np.array([0, 1])), {}, "x", 1 << 26, 0, "s3://b/",
                         np.zeros(0, np.int64), sources=sources)
    assert got.source_of().tolist() == [1, 0] and got.source_names() == ["code", "web"]


def test_a_job_table_blob_beside_records_wins_over_them(cache: Cache) -> None:
    """An older version run after this one (a downgrade) reads and writes the blob only: its jobs are the newer."""
    cache.jobs.attach("a", "aaaa1111")
    cache.jobs.map_epoch("a", 0, 1)
    cache.jobs.attach("c", "cccc3333")  # a job the older version never saw: its record stays
    cache.leasing.save_jobs().result()
    _legacy_jobs(cache, 9)
    cache.reopen()
    assert {j.name: j.epochs for j in cache.jobs.all()} == {"a": {0: 9}, "b": {0: 9}, "c": {}}
    cache.writer.submit(lambda txn: None).result()
    keys = cache.meta_keys()
    assert "jobs" not in keys and keys[JOB_PREFIX + "a"]["epochs"] == {"0": 9}


def test_an_epochs_missing_shards_are_counted_as_they_go(cache: Cache) -> None:
    """What GET/POST of a job's epoch answer 410 from: the epoch's shards that are no longer resident."""
    from samplecache_service.store.catalog import Shard
    shards = [Shard(id=i, key=f"k{i}", path="a.parquet", row_group=i, unit=i, cycle=0, rows=3, bytes=30,
                    rows_per_block=3, blocks=1, created=0.0) for i in range(1, 6)]
    for s in shards:
        cache.catalog.added_shard(s)
    cache.writer.seal(0, lambda: build_manifest(0, cache.catalog.columns(), {}, "x", 1 << 26, 0, "s3://b/",
                                                np.zeros(0, np.int64))).result()
    assert cache.leasing.missing_shards(0) == 0 and len(cache.epochs.named_ids(0)) == 5
    for sid in (2, 5):
        cache.catalog.removed_shard(sid)
    assert cache.leasing.missing_shards(0) == 2
    assert cache.leasing.missing_shards(7) == 0  # not sealed: names nothing
