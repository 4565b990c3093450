"""The job table: attach, join, take over, resume, epoch mappings, reads, expiry and persistence."""

from __future__ import annotations

import pytest
from fake_clock import FakeClock as Clock

from samplecache_service.epochs.jobs import PIN_GRACE_S, JobTable
from samplecache_service.errors import Conflict, NotFound, ServiceError


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock: Clock) -> JobTable:
    return JobTable(ttl=60.0, clock=clock)


def test_a_new_job_starts_at_epoch_0_and_its_run_joins_it(table: JobTable) -> None:
    job = table.attach("train", "aaaa1111")
    assert (job.name, job.run, job.start_epoch, job.runs) == ("train", "aaaa1111", 0, 1)
    table.map_epoch("train", 0, 7)
    again = table.attach("train", "aaaa1111")  # another worker or rank of the same run
    assert again is job and again.start_epoch == 0 and again.epochs == {0: 7}


def test_a_new_run_takes_the_job_over_at_its_next_epoch(table: JobTable) -> None:
    table.attach("train", "aaaa1111")
    table.map_epoch("train", 0, 3)
    table.map_epoch("train", 1, 5)
    job = table.attach("train", "bbbb2222")
    assert (job.run, job.start_epoch, job.runs) == ("bbbb2222", 2, 2)
    assert job.epochs == {0: 3, 1: 5}  # the mapping belongs to the job: a resumed epoch reads the same data
    with pytest.raises(ServiceError) as info:  # the replaced run is told, never silently reads on
        table.job("train", "aaaa1111")
    assert isinstance(info.value, Conflict) and "taken over" in info.value.message
    with pytest.raises(ServiceError) as info:
        table.attach("train", "aaaa1111")  # and cannot take it back
    assert isinstance(info.value, Conflict)


def test_resume_needs_a_known_job_and_names_the_known_ones(table: JobTable) -> None:
    table.attach("alpha", "aaaa1111")
    table.attach("beta", "bbbb2222")
    with pytest.raises(ServiceError) as info:
        table.attach("gamma", "cccc3333", resume=True)
    assert isinstance(info.value, NotFound)
    assert "'gamma'" in info.value.message and "alpha, beta" in info.value.message
    assert info.value.extra["known"] == ["alpha", "beta"]
    assert table.attach("beta", "dddd4444", resume=True).run == "dddd4444"


def test_a_run_that_never_attached_is_refused(table: JobTable) -> None:
    table.attach("train", "aaaa1111")
    with pytest.raises(ServiceError) as info:
        table.job("train", "ffff0000")
    assert isinstance(info.value, Conflict) and "POST /v1/jobs" in info.value.message
    with pytest.raises(ServiceError) as info:
        table.job("nope")
    assert isinstance(info.value, NotFound)


def test_reads_of_ended_leases_add_up_per_job_epoch(table: JobTable) -> None:
    table.attach("train", "aaaa1111")
    table.add_read("train", 0, 100)
    table.add_read("train", 0, 50)
    table.add_read("train", 1, 7)
    table.add_read("train", None, 9)  # a lease without a job epoch counts for nothing
    table.add_read("other", 0, 9)  # an unknown job: ignored
    assert table.job("train").read == {0: 150, 1: 7}


def test_a_new_mapping_pins_its_epoch_until_its_first_lease_or_a_short_grace(table: JobTable, clock: Clock) -> None:
    table.attach("train", "aaaa1111")
    table.map_epoch("train", 0, 4)
    table.map_epoch("train", 1, 5)
    assert table.recently_mapped() == {4, 5}
    table.lease_taken("train", 0)  # its reader's lease pins epoch 4 now; the mapping no longer does
    assert table.recently_mapped() == {5}
    clock.now += PIN_GRACE_S  # never leased: the pin ends after the grace, not the lease TTL (60 s here)
    assert table.recently_mapped() == set()


def test_a_job_without_lease_or_request_expires_and_comes_back_when_it_attaches(table: JobTable, clock: Clock) -> None:
    table.attach("idle", "aaaa1111")
    table.attach("reading", "bbbb2222")
    table.map_epoch("idle", 0, 1)
    clock.now += 30
    assert table.expire(leased=set()) == []
    clock.now += 31
    gone = table.expire(leased={"reading"})  # a live lease keeps a job alive
    assert [j.name for j in gone] == ["idle"] and table.active() == 1
    assert table.recently_mapped() == set()  # an expired job pins nothing
    table.job("idle")  # an inspection does not revive it
    assert table.job("idle").expired
    job = table.attach("idle", "aaaa1111")  # its run comes back (a long stall): the job lives again
    assert not job.expired and job.epochs == {0: 1}


def test_inspection_does_not_keep_a_job_alive(table: JobTable, clock: Clock) -> None:
    table.attach("train", "aaaa1111")
    for _ in range(3):
        clock.now += 30
        table.job("train")
    assert [j.name for j in table.expire(set())] == ["train"]


def test_saved_jobs_come_back_with_a_fresh_ttl(table: JobTable, clock: Clock) -> None:
    table.attach("train", "aaaa1111")
    table.map_epoch("train", 0, 2)
    table.map_epoch("train", 1, 3)
    table.add_read("train", 0, 11)
    table.attach("old", "bbbb2222")
    clock.now += 100
    table.expire(set())
    saved = table.saved()
    clock.now += 1000
    again = JobTable(ttl=60.0, clock=clock)
    again.load(saved)
    job = again.job("train", "aaaa1111")
    assert job.epochs == {0: 2, 1: 3} and job.read == {0: 11}
    assert again.expire(set()) == []  # reloaded live jobs get a fresh TTL
    assert again.job("old").expired  # expired ones stay expired (kept for a restart by name)
    assert again.attach("train", "cccc3333").start_epoch == 2


def test_expired_jobs_beyond_the_cap_are_forgotten_oldest_first(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    import samplecache_service.epochs.jobs as jobs
    monkeypatch.setattr(jobs, "JOBS_KEPT", 3)
    table = JobTable(ttl=1.0, clock=clock)
    for i in range(3):
        table.attach(f"j{i}", f"aaaa000{i}")
        clock.now += 0.1
    clock.now += 2
    table.expire(set())
    table.attach("j3", "aaaa0003")
    table.attach("j4", "aaaa0004")
    assert [j.name for j in table.all()] == ["j2", "j3", "j4"]


def test_changes_name_the_jobs_changed_since_the_last_take(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    import samplecache_service.epochs.jobs as jobs
    monkeypatch.setattr(jobs, "JOBS_KEPT", 2)
    table = JobTable(ttl=1.0, clock=clock)
    table.attach("a", "aaaa1111")
    table.attach("b", "bbbb2222")
    assert sorted(table.take_changes()) == ["a", "b"]
    assert table.take_changes() == {}
    table.job("a", "aaaa1111")  # a request that keeps it alive: nothing to save
    assert table.take_changes() == {}
    table.map_epoch("a", 0, 3)
    table.add_read("a", 0, 5, {"web": 5})
    table.set_mixture("a", "aaaa1111", 0, {"mixture": {"web": 1.0}})
    got = table.take_changes()
    assert list(got) == ["a"] and got["a"]["read_sources"] == {"0": {"web": 5}}
    table.unsaved(["a"])  # its commit failed: the next take has it again, as it is then
    assert list(table.take_changes()) == ["a"]
    clock.now += 10
    assert len(table.expire(set())) == 2
    assert sorted(table.take_changes()) == ["a", "b"]  # expired: saved as such
    table.attach("c", "cccc3333")  # beyond JOBS_KEPT: the oldest expired job is forgotten, its record dropped
    got = table.take_changes()
    assert got["c"]["name"] == "c" and [n for n, r in got.items() if r is None] == ["a"]
