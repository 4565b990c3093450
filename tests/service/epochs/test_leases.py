"""LeaseTable with a fake clock (take / heartbeat / release / expiry / reload), and the epoch cap of
``select_shards`` (a seeded subset of the resident shards)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fake_clock import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from samplecache_service.epochs.leases import Lease, LeaseTable
from samplecache_service.epochs.manager import select_shards as select_positions
from samplecache_service.errors import Gone, Invalid, NotFound, ServiceError, TooMany
from samplecache_service.store.catalog import Shard


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
def table(clock: FakeClock) -> LeaseTable:
    return LeaseTable(default_ttl=10.0, max_ttl=100.0, clock=clock)


# ---------------------------------------------------------------------------------------------- take
def test_take_gives_a_lease_with_the_default_ttl(table: LeaseTable, clock: FakeClock) -> None:
    lease = table.take(3, holder="host pid 1")
    assert isinstance(lease, Lease)
    assert lease.epoch == 3 and lease.ttl == 10.0 and lease.holder == "host pid 1"
    assert lease.created_at == clock.now and lease.expires_at == clock.now + 10.0
    assert lease.id and all(c in "0123456789abcdef" for c in lease.id)
    assert table.live() == [lease]
    assert table.epochs() == {3}
    assert lease.to_json() == {"id": lease.id, "epoch": 3, "ttl": 10.0, "expires_at": clock.now + 10.0,
                               "created_at": clock.now, "holder": "host pid 1", "job": None, "run": None,
                               "job_epoch": None, "read": 0, "read_sources": {}}


def test_take_with_an_explicit_ttl(table: LeaseTable, clock: FakeClock) -> None:
    lease = table.take(0, ttl=2.5)
    assert lease.ttl == 2.5 and lease.expires_at == clock.now + 2.5
    assert table.take(0, ttl=100.0).ttl == 100.0  # max_ttl itself is allowed


def test_lease_ids_are_unique(table: LeaseTable) -> None:
    ids = {table.take(0).id for _ in range(200)}
    assert len(ids) == 200


@pytest.mark.parametrize("ttl", [0.0, -1.0, 100.0001, 1e9, math.inf, -math.inf, math.nan])
def test_bad_ttl_is_422(table: LeaseTable, ttl: float) -> None:
    with pytest.raises(ServiceError) as e:
        table.take(0, ttl=ttl)
    assert isinstance(e.value, Invalid)
    assert "ttl" in e.value.message
    assert table.live() == []


# ---------------------------------------------------------------------------------------------- heartbeat
def test_heartbeat_extends_by_the_ttl(table: LeaseTable, clock: FakeClock) -> None:
    lease = table.take(1, ttl=5.0)
    for _ in range(10):  # far longer than one TTL in total, but never 5 s without a heartbeat
        clock.advance(4.0)
        got = table.heartbeat(1, lease.id)
        assert got.id == lease.id and got.expires_at == clock.now + 5.0
        assert table.expire() == []
    assert [l.id for l in table.live()] == [lease.id]


def test_expiry_after_ttl_without_heartbeat(table: LeaseTable, clock: FakeClock) -> None:
    short = table.take(1, ttl=5.0)
    long = table.take(2, ttl=50.0)
    clock.advance(4.999)
    assert {l.id for l in table.live()} == {short.id, long.id}
    assert table.epochs() == {1, 2}
    clock.advance(0.001)  # exactly at expires_at: gone
    assert [l.id for l in table.live()] == [long.id]
    assert table.epochs() == {2}
    gone = table.expire()
    assert [l.id for l in gone] == [short.id]
    assert table.expired_total == 1
    assert table.expire() == []
    assert table.get(short.id) is None and table.get(long.id) is long  # its record is dropped (Leasing.ended)


def test_heartbeat_after_expiry_is_410(table: LeaseTable, clock: FakeClock) -> None:
    lease = table.take(1, ttl=5.0)
    clock.advance(7.0)
    with pytest.raises(ServiceError) as e:
        table.heartbeat(1, lease.id)
    assert isinstance(e.value, Gone)
    assert "expired" in e.value.message
    assert table.expired_total == 1
    assert table.live() == [] and table.get(lease.id) is None


def test_heartbeat_after_expiry_is_410_even_once_collected(table: LeaseTable, clock: FakeClock) -> None:
    lease = table.take(1, ttl=5.0)
    clock.advance(7.0)
    assert [l.id for l in table.expire()] == [lease.id]  # what Daemon._expire_leases does every loop
    with pytest.raises(ServiceError) as e:
        table.heartbeat(1, lease.id)
    assert isinstance(e.value, Gone)


def test_job_leases_carry_their_reads_to_the_end_however_they_end(table: LeaseTable, clock: FakeClock) -> None:
    a = table.take(3, job="train", run="aaaa1111", job_epoch=0)
    b = table.take(3, job="train", run="aaaa1111", job_epoch=0)
    c = table.take(3, job="train", run="aaaa1111", job_epoch=0)
    assert (a.job, a.run, a.job_epoch, a.read) == ("train", "aaaa1111", 0, 0)
    table.heartbeat(3, a.id, read=40)
    table.heartbeat(3, a.id, read=30)  # reads only grow
    assert table.release(3, a.id, read=55).read == 55
    table.heartbeat(3, b.id, read=7)
    table.heartbeat(3, c.id, read=9)
    assert table.jobs() == {"train"}
    clock.now += 11
    with pytest.raises(ServiceError):
        table.heartbeat(3, b.id, read=8)  # found expired by its heartbeat ...
    ended = {l.id: l.read for l in table.expire()}
    assert ended == {b.id: 7, c.id: 9}  # ... and still handed out once, with its reads, for the job
    assert table.expire() == [] and table.jobs() == set()


def test_unknown_lease_is_404(table: LeaseTable) -> None:
    lease = table.take(1)
    for epoch, lid in ((1, "deadbeef"), (2, lease.id)):  # unknown id; right id, wrong epoch
        with pytest.raises(ServiceError) as e:
            table.heartbeat(epoch, lid)
        assert isinstance(e.value, NotFound) and lid in e.value.message
        with pytest.raises(ServiceError) as e:
            table.release(epoch, lid)
        assert isinstance(e.value, NotFound)
    assert [l.id for l in table.live()] == [lease.id]  # untouched by the failed calls


# ---------------------------------------------------------------------------------------------- release
def test_release_ends_the_lease(table: LeaseTable) -> None:
    a, b = table.take(4), table.take(4)
    assert table.release(4, a.id).id == a.id
    assert [l.id for l in table.live()] == [b.id]
    assert table.epochs() == {4}  # still leased by b
    with pytest.raises(ServiceError) as e:  # a second release
        table.release(4, a.id)
    assert isinstance(e.value, NotFound)
    with pytest.raises(ServiceError) as e:  # and a heartbeat of a released lease
        table.heartbeat(4, a.id)
    assert isinstance(e.value, NotFound)
    table.release(4, b.id)
    assert table.epochs() == set() and table.get(b.id) is None
    assert table.expired_total == 0  # releases are not expiries


def test_epochs_of_live_leases_only(table: LeaseTable, clock: FakeClock) -> None:
    table.take(0, ttl=1.0)
    table.take(1, ttl=3.0)
    table.take(1, ttl=9.0)
    table.take(2, ttl=5.0)
    assert table.epochs() == {0, 1, 2}
    clock.advance(2.0)
    assert table.epochs() == {1, 2}
    clock.advance(2.0)
    assert table.epochs() == {1, 2}  # epoch 1 still has its 9 s lease
    clock.advance(2.0)
    assert table.epochs() == {1}
    clock.advance(3.0)
    assert table.epochs() == set()


# ---------------------------------------------------------------------------------------------- persistence
def test_load_gives_saved_leases_a_fresh_ttl(clock: FakeClock) -> None:
    before = LeaseTable(default_ttl=10.0, clock=clock)
    a = before.take(5, ttl=8.0, holder="rank 0")
    b = before.take(6, ttl=30.0)
    saved = [l.to_json() for l in before.live()]
    assert sorted(d["id"] for d in saved) == sorted([a.id, b.id])

    clock.advance(1000.0)  # the daemon was down far longer than any TTL
    after = LeaseTable(default_ttl=10.0, clock=clock)
    after.load(saved)
    live = {l.id: l for l in after.live()}
    assert set(live) == {a.id, b.id}
    assert live[a.id].expires_at == clock.now + 8.0 and live[a.id].holder == "rank 0"
    assert live[b.id].expires_at == clock.now + 30.0
    assert after.epochs() == {5, 6}
    # heartbeats and releases work on reloaded leases; without heartbeats they expire after their own TTL
    after.heartbeat(5, a.id)
    clock.advance(9.0)
    assert after.epochs() == {6}
    after.release(6, b.id)
    assert after.epochs() == set()


def test_saved_round_trips_through_json(table: LeaseTable) -> None:
    import json

    table.take(1, holder="h")
    raw = json.dumps([l.to_json() for l in table.live()])
    other = LeaseTable(default_ttl=10.0, clock=table.clock)
    other.load(json.loads(raw))
    assert [l.to_json() for l in other.live()] == [l.to_json() for l in table.live()]


# ---------------------------------------------------------------------------------------------- caps
def test_a_take_past_the_host_cap_is_refused_until_one_ends(clock: FakeClock) -> None:
    table = LeaseTable(default_ttl=10.0, clock=clock, max_leases=3, max_per_job=3)
    held = [table.take(1) for _ in range(3)]
    with pytest.raises(TooMany, match="holds 3 leases, its limit") as e:
        table.take(1)
    assert e.value.retry_after == 10.0
    table.release(1, held[0].id)
    table.take(1)
    clock.advance(11.0)  # every lease's TTL ran out: a take collects them rather than refusing
    assert table.take(1).epoch == 1 and len(table.live()) == 1


def test_a_job_past_its_cap_is_refused_and_others_are_not(clock: FakeClock) -> None:
    table = LeaseTable(default_ttl=10.0, clock=clock, max_leases=100, max_per_job=2)
    a = [table.take(1, job="a", run="r", job_epoch=0) for _ in range(2)]
    with pytest.raises(TooMany, match="job 'a' holds 2 leases"):
        table.take(1, job="a", run="r", job_epoch=0)
    table.take(1, job="b", run="r", job_epoch=0)  # another job has its own cap
    table.take(1)  # and leases of no job only the host's
    table.release(1, a[0].id)
    table.take(1, job="a", run="r", job_epoch=0)
    clock.advance(11.0)
    assert len(table.expire()) == 4
    table.take(1, job="a", run="r", job_epoch=0)  # expired ones no longer count for the job


def test_summary_shows_the_newest_and_counts_them_all(table: LeaseTable, clock: FakeClock) -> None:
    ids = []
    for i in range(7):
        ids.append(table.take(1, job="j" if i % 2 else None, run="r", job_epoch=0).id)
        clock.advance(0.1)
    shown, live, by_job = table.summary(3)
    assert [l.id for l in shown] == ids[:-4:-1] and live == 7 and by_job == {"j": 3}


# ---------------------------------------------------------------------------------------------- property
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["take", "beat", "release", "tick"]), st.integers(0, 3),
                          st.floats(0.1, 20.0)), max_size=60))
def test_live_leases_match_a_model(ops: list[tuple[str, int, float]]) -> None:
    """Random take/heartbeat/release/clock steps against a dict model of expiry times."""
    clock = FakeClock(1_000_000.0)
    table = LeaseTable(default_ttl=5.0, max_ttl=20.0, clock=clock)
    model: dict[str, tuple[int, float, float]] = {}  # id -> (epoch, ttl, expires_at)
    for op, k, x in ops:
        if op == "take":
            lease = table.take(k, ttl=x)
            model[lease.id] = (k, x, clock.now + x)
        elif op == "tick":
            clock.advance(x)
        elif model:
            lid = sorted(model)[k % len(model)]
            epoch, ttl, exp = model[lid]
            if op == "beat":
                if exp <= clock.now:
                    with pytest.raises(ServiceError) as e:
                        table.heartbeat(epoch, lid)
                    assert isinstance(e.value, Gone)
                    del model[lid]
                else:
                    table.heartbeat(epoch, lid)
                    model[lid] = (epoch, ttl, clock.now + ttl)
            else:
                table.release(epoch, lid)
                del model[lid]
        live = {l.id for l in table.live()}
        assert live == {lid for lid, (_, _, exp) in model.items() if exp > clock.now}
        assert table.epochs() == {e for lid, (e, _, exp) in model.items() if exp > clock.now}


# ---------------------------------------------------------------------------------------------- epoch cap
def shard(sid: int, rows: int) -> Shard:
    return Shard(id=sid, key=f"c0-u{sid}", path=f"p{sid % 3}.parquet", row_group=sid, unit=sid, cycle=0, rows=rows,
                 bytes=rows * 100, rows_per_block=rows, blocks=1, created=0.0)



def select_shards(shards: list[Shard], cap: int, seed: int, epoch: int) -> list[Shard]:
    """The shards ``select_positions`` picks (it works on the rows column)."""
    rows = np.array([s.rows for s in shards], np.int64)
    return [shards[i] for i in select_positions(rows, cap, seed, epoch).tolist()]

@st.composite
def resident(draw: st.DrawFn) -> list[Shard]:
    rows = draw(st.lists(st.integers(1, 500), min_size=1, max_size=40))
    ids = sorted(draw(st.lists(st.integers(1, 10**6), min_size=len(rows), max_size=len(rows), unique=True)))
    return [shard(i, r) for i, r in zip(ids, rows)]


def test_select_without_a_cap_is_every_shard() -> None:
    shards = [shard(i, 10) for i in range(1, 8)]
    assert select_shards(shards, 0, seed=1, epoch=0) == shards
    assert select_shards(shards, -5, seed=1, epoch=0) == shards
    assert select_shards(shards, 70, seed=1, epoch=0) == shards  # exactly at the cap
    assert select_shards(shards, 10**9, seed=1, epoch=0) == shards
    assert select_shards([], 5, seed=1, epoch=0) == []


@settings(max_examples=200, deadline=None)
@given(resident(), st.integers(1, 5000), st.integers(0, 2**31), st.integers(0, 1000))
def test_select_with_a_cap(shards: list[Shard], cap: int, seed: int, epoch: int) -> None:
    got = select_shards(shards, cap, seed, epoch)
    total = sum(s.rows for s in shards)
    if total <= cap:
        assert got == shards
        return
    ids = [s.id for s in got]
    assert got, "a capped epoch has at least one shard"
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "id (= age) order, no repeats"
    assert set(ids) <= {s.id for s in shards}
    rows = sum(s.rows for s in got)
    assert rows <= cap or len(got) == 1, f"{rows} rows > cap {cap} with {len(got)} shards"
    # greedy: every shard left out would have pushed the epoch over the cap
    left_out = [s for s in shards if s.id not in set(ids)]
    assert all(rows + s.rows > cap for s in left_out)
    # seeded: the same (seed, epoch) gives the same subset
    assert select_shards(list(shards), cap, seed, epoch) == got


def test_select_with_a_cap_varies_by_epoch_and_seed() -> None:
    shards = [shard(i, 10) for i in range(1, 41)]
    subsets = {tuple(s.id for s in select_shards(shards, 100, seed=0, epoch=e)) for e in range(10)}
    assert len(subsets) > 5
    assert all(len(s) == 10 for s in subsets)
    by_seed = {tuple(s.id for s in select_shards(shards, 100, seed=k, epoch=0)) for k in range(10)}
    assert len(by_seed) > 5


def test_select_with_a_cap_smaller_than_any_shard_keeps_one() -> None:
    shards = [shard(i, 100) for i in range(1, 6)]
    got = select_shards(shards, 10, seed=3, epoch=2)
    assert len(got) == 1 and got[0] in shards


def test_per_source_reads_only_grow_and_end_with_the_lease(table: LeaseTable) -> None:
    lease = table.take(1, job="j", run="r", job_epoch=0)
    table.heartbeat(1, lease.id, 30, {"web": 20, "code": 10})
    table.heartbeat(1, lease.id, 25, {"web": 15, "math": 5})  # late: never takes back what a newer one said
    assert lease.read == 30 and lease.read_sources == {"web": 20, "code": 10, "math": 5}
    ended = table.release(1, lease.id, 40, {"web": 28, "code": 12})
    assert ended.read == 40 and ended.read_sources == {"web": 28, "code": 12, "math": 5}
