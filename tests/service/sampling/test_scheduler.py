"""service/samplecache_service/sampling/scheduler.py: each decision of the Scheduler, one test each.

The scheduler is driven by hand on the test's thread: ``Rig.turn`` is one ``step()`` of the loop. Its collaborators
are fakes kept in this file (catalog, writer, disk, samplers, discovery) and a fake clock; traffic and pacing are
the real small ``Traffic`` and ``Pacer`` on that clock; the planner is the real ``Planner`` over a small file table.
No threads, subprocesses, S3, LMDB or sleeping: every test runs in milliseconds.
"""

from __future__ import annotations

import collections
import errno
import logging
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterable, cast

import lmdb
import pytest
from fake_clock import FakeClock

from samplecache_service.config.settings import Settings
from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.planner import Planner
from samplecache_service.remote.stores import RemoteError
from samplecache_service.sampling.backoff import JITTER, MAX_UNIT_BACKOFF
from samplecache_service.sampling.pacing import Pacer
from samplecache_service.sampling.sampler import SampleResult, SampleTask
from samplecache_service.sampling.scheduler import CORRUPT_CONFIRMATIONS, MAX_UNIT_ATTEMPTS, Scheduler
from samplecache_service.sampling.traffic import Traffic
from samplecache_service.store.budget import Budget
from samplecache_service.store.catalog import Catalog, Resident, Shard
from samplecache_service.store.disk import DiskSpace
from samplecache_service.store.eviction import EvictionPlan
from samplecache_service.store.fileinfo import FileInfo
from samplecache_service.store.writer import DamagedShard, Ingested, NoRoom, Writer

SOURCE = "s3://bucket/ds"


# ----------------------------------------------------------------------------- fakes
class FakeCatalog:
    """What the scheduler reads of the catalog: the file table, meta, and which units are resident."""

    def __init__(self) -> None:
        self._files: dict[str, FileInfo] = {}
        self._meta: dict[str, Any] = {}
        self._units: collections.Counter[tuple[str, int]] = collections.Counter()
        self.files_version = 0
        self.resident_bytes = 0

    def files(self) -> dict[str, FileInfo]:
        return dict(self._files)

    def file(self, path: str) -> FileInfo:
        return self._files.get(path) or FileInfo()

    def set_file(self, path: str, info: FileInfo) -> None:
        self._files[path] = info
        self.files_version += 1

    def meta(self, key: str, default: Any = None) -> Any:
        return self._meta.get(key, default)

    def set_meta(self, key: str, value: Any) -> None:
        self._meta[key] = value

    def unit_resident(self, path: str, row_group: int, source: str = "default") -> bool:
        return self._units[(path, row_group)] > 0

    def resident_units(self) -> int:
        return sum(1 for n in self._units.values() if n > 0)

    def resident(self, source: str) -> Resident:
        """The one source's: every unit and byte here."""
        return Resident(units=self.resident_units(), bytes=self.resident_bytes)

    def add_shard(self, path: str, row_group: int, nbytes: int) -> None:
        self._units[(path, row_group)] += 1
        self.resident_bytes += nbytes

    def evict_unit(self, path: str, row_group: int, nbytes: int) -> None:
        del self._units[(path, row_group)]
        self.resident_bytes -= nbytes


class FakeWriter:
    """Ingests "staged" shards registered by ``Rig.ok`` straight into the fake catalog, or fails them with the
    next exception queued in ``outcomes``; futures complete at once, as if the writer thread were instant."""

    def __init__(self, catalog: FakeCatalog) -> None:
        self.catalog = catalog
        self.staged: dict[str, tuple[SampleTask, int]] = {}  # staging path -> (its task, its bytes)
        self.outcomes: list[BaseException | None] = []
        self.ingested: list[str] = []  # every ingest call, in order (retries included)
        self.make_rooms: list[Callable[[int], EvictionPlan] | None] = []
        self.files_put: list[dict[str, FileInfo]] = []
        self.metas: list[dict[str, Any]] = []
        self.keys: set[str] = set()  # the keys of the shards in, as the real writer skips a part it has
        self._next_id = 1

    def ingest(self, staged_path: Path, cursor: Callable[[int, int], dict[str, Any]] | None = None,
               make_room: Callable[[int], EvictionPlan] | None = None) -> "Future[Ingested]":
        self.ingested.append(str(staged_path))
        self.make_rooms.append(make_room)
        fut: Future[Ingested] = Future()
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            fut.set_exception(outcome)
            return fut
        task, nbytes = self.staged[str(staged_path)]
        if Path(staged_path).stem in self.keys:
            fut.set_result(Ingested(None, ()))
            return fut
        self.keys.add(Path(staged_path).stem)
        self.catalog.add_shard(task.path, task.row_group, nbytes)
        shard = Shard(id=self._next_id, key=Path(staged_path).stem, path=task.path, row_group=task.row_group,
                      unit=task.unit, cycle=task.cycle, rows=10, bytes=nbytes, rows_per_block=10, blocks=1,
                      created=0.0)
        self._next_id += 1
        fut.set_result(Ingested(shard, ()))
        return fut

    def put_files(self, files: dict[str, FileInfo]) -> "Future[None]":
        self.files_put.append(files)
        for path, info in files.items():
            self.catalog.set_file(path, info)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def put_meta(self, items: dict[str, Any]) -> "Future[None]":
        self.metas.append(dict(items))
        for k, v in items.items():
            self.catalog.set_meta(k, v)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


class FakeDisk:
    def __init__(self) -> None:
        self.free_bytes = 1 << 40
        self.fs_free = 1 << 40

    def free(self, fresh: bool = False) -> int:
        return self.free_bytes


class FakeSamplers:
    """The supervisor: tasks wait in ``queue`` until the test answers them (``Rig.answer``)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.queue: list[SampleTask] = []
        self.submitted: list[SampleTask] = []
        self.crashing: str | None = None

    def submit(self, task: SampleTask) -> None:
        self.queue.append(task)
        self.submitted.append(task)

    def pending(self) -> int:
        return len(self.queue)

    def crash_loop(self) -> str | None:
        return self.crashing


class FakeSchema:
    def to_json(self) -> dict[str, Any]:
        return {"fields": []}


class FakeDiscovery:
    """Lists ``listing`` (path -> file info) into the catalog; the dataset gets a schema at the first success."""

    def __init__(self, catalog: FakeCatalog, listing: dict[str, FileInfo]) -> None:
        self.catalog, self.listing = catalog, listing
        self.schema: FakeSchema | None = None
        self.fail: str | None = None
        self.calls = 0

    def run(self) -> list[str]:
        self.calls += 1
        if self.fail is not None:
            raise RemoteError(self.fail)
        new = sorted(p for p in self.listing if p not in self.catalog.files())
        for p in new:
            self.catalog.set_file(p, self.listing[p])
        self.schema = FakeSchema()
        return new

    def target_text(self) -> str | None:
        return None


def table(files: int = 1, groups: int = 4, rg_bytes: int = 100, prefix: str = "f", seq: int = 1
          ) -> dict[str, FileInfo]:
    """A discovered file table: ``files`` files of ``groups`` row groups of 10 rows and ``rg_bytes`` bytes."""
    return {f"{SOURCE}/{prefix}{i}.parquet": FileInfo(
        row_groups=(10,) * groups, row_group_bytes=(rg_bytes,) * groups,
        units=tuple((g, 1, 10) for g in range(groups)), size=5000 + i, footer=300, seq=seq + i)
        for i in range(files)}


class Rig:
    """A scheduler wired to the fakes above."""

    def __init__(self, tmp_path: Path, listing: dict[str, FileInfo] | None = None, samplers: int = 1,
                 max_bytes: int = 1 << 30, min_free_disk: int = 1 << 20, **settings: Any) -> None:
        self.tmp_path = tmp_path
        self.settings = Settings(source=SOURCE, cache_dir=tmp_path, samplers=samplers, max_bytes=max_bytes,
                                 min_free_disk=min_free_disk, **settings)
        self.clock = FakeClock()
        self.catalog = FakeCatalog()
        self.writer = FakeWriter(self.catalog)
        self.disk = FakeDisk()
        self.samplers = FakeSamplers(samplers)
        self.discovery = FakeDiscovery(self.catalog, table() if listing is None else listing)
        self.pacer = Pacer(self.settings.pacing, self.settings.replace_per_epoch, int(self.settings.max_ingest_rate),
                           clock=self.clock)
        self.traffic = Traffic(self.pacer, lambda: 0)
        self.budget = Budget(int(self.settings.max_bytes), int(self.settings.min_free_disk), "fifo")
        self.pins: list[int] = []
        self.died: list[str] = []
        self.lease_expiries = 0
        self.sched = Scheduler(
            self.settings, cast(Catalog, self.catalog), cast(Writer, self.writer), cast(DiskSpace, self.disk),
            self.traffic, self.samplers, self.budget, cast(Discovery, self.discovery),
            pinned_epochs=lambda: list(self.pins), make_room=self.make_room, expire_leases=self.expire_leases,
            die=self.died.append, source_shown=SOURCE, clock=self.clock)

    def make_room(self, size: int, source: str | None = None) -> EvictionPlan:
        return EvictionPlan((), 0, True)

    def expire_leases(self) -> None:
        self.lease_expiries += 1

    def turn(self, times: int = 1) -> None:
        """``times`` turns of the loop. A no-op event first: ``step`` drains the inbox with a 50 ms wait when it
        is empty (the loop's idle wait), which a test does not want."""
        for _ in range(times):
            self.sched.post(lambda: None)
            self.sched.step()

    def take(self) -> SampleTask:
        """The oldest task out at the samplers (the one a sampler answers next)."""
        assert self.samplers.queue, "no task is out at the samplers"
        return self.samplers.queue[0]

    def answer(self, result: SampleResult) -> None:
        """A sampler answers ``result.task``: it leaves the samplers and the result reaches the inbox."""
        self.samplers.queue.remove(result.task)
        self.sched.on_result(result)

    def ok(self, task: SampleTask, nbytes: int = 100, parts: int = 1) -> SampleResult:
        """A staged result of ``parts`` shards of ``nbytes`` each (registered with the fake writer)."""
        paths = [str(self.settings.staging_dir / f"{task.key}{'' if parts == 1 else f'-p{k}'}.shard")
                 for k in range(parts)]
        for p in paths:
            self.writer.staged[p] = (task, nbytes)
        return SampleResult(task=task, ok=True, staged=paths[-1], rows=10 * parts, bytes=nbytes * parts,
                            remote_bytes=nbytes * parts, parts=[(p, nbytes) for p in paths] if parts > 1 else [])

    def sample_ok(self, nbytes: int = 100) -> SampleTask:
        """The oldest task out comes back sampled; returns it."""
        task = self.take()
        self.answer(self.ok(task, nbytes))
        return task

    def fail(self, kind: str | None, error: str = "boom") -> SampleTask:
        """The oldest task out comes back failed with ``kind``; returns it."""
        task = self.take()
        self.answer(SampleResult(task=task, ok=False, error_kind=kind, error=error))
        return task

    def units(self, tasks: Iterable[SampleTask]) -> list[tuple[str, int]]:
        return [(t.path, t.row_group) for t in tasks]


def wait_and_resubmit(rig: Rig, base: float) -> None:
    """The unit deferred with ``base`` (before jitter) is not sent again before 0.75 x base, and is by 1.25 x."""
    before = len(rig.samplers.submitted)
    rig.clock.advance(base * JITTER[0] * 0.99)
    rig.turn()
    assert len(rig.samplers.submitted) == before, f"re-sent before {JITTER[0]} x {base}s"
    rig.clock.advance(base * (JITTER[1] - JITTER[0] * 0.99) + 1e-6)
    rig.turn()
    assert len(rig.samplers.submitted) == before + 1, f"not re-sent after {JITTER[1]} x {base}s"


# ----------------------------------------------------------------------------- discovery, state, coverage
def test_first_turn_discovers_plans_and_fills_two_tasks_per_sampler(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=2, groups=4), samplers=3)
    assert rig.sched.state() == "discovering" and rig.sched.coverage() is None
    rig.turn()
    assert rig.discovery.calls == 1 and rig.sched.planner is not None and len(rig.sched.planner) == 8
    assert rig.sched.state() == "sampling" and rig.sched.paused_reason is None
    assert len(rig.samplers.submitted) == 6  # 2 x samplers out at once, no more
    assert len(set(rig.units(rig.samplers.submitted))) == 6
    assert rig.lease_expiries == 1
    rig.turn()
    assert len(rig.samplers.submitted) == 6  # nothing came back: nothing more is sent


def test_task_carries_the_catalog_file_facts_and_a_unit_key(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=2), samplers=1)
    rig.turn()
    t = rig.take()
    info = rig.catalog.file(t.path)
    assert (t.file_size, t.footer_bytes) == (info.size, info.footer)
    assert t.source == SOURCE and t.staging_dir == str(rig.settings.staging_dir)
    assert t.part_bytes == rig.settings.part_bytes and t.schema == {"fields": []}
    assert t.key.startswith(f"c{t.cycle}-u{t.unit}-")
    assert len({x.key for x in rig.samplers.submitted}) == 2


def test_samplers_in_a_crash_loop_are_the_state_whatever_else_holds(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.sched.planner = cast(Planner, object())  # planned: state() reads no more of it
    assert rig.sched.state() == "sampling"
    rig.samplers.crashing = "sampler processes crash at start"
    assert rig.sched.state() == "crash loop"
    rig.sched.paused_reason = "paused by request"
    assert rig.sched.state() == "crash loop"
    rig.samplers.crashing = None
    assert rig.sched.state() == "paused"


def test_failed_discovery_is_remote_error_and_is_retried_after_retry_seconds(tmp_path: Path) -> None:
    rig = Rig(tmp_path, retry_seconds=7.0)
    rig.discovery.fail = "listing failed: 503"
    rig.turn()
    assert rig.sched.state() == "remote error"
    assert rig.sched.last_error == "listing failed: 503" and rig.sched.remote_errors == 1
    rig.discovery.fail = None
    rig.clock.advance(6.9)
    rig.turn()
    assert rig.discovery.calls == 1  # not before retry_seconds
    rig.clock.advance(0.2)
    rig.turn()
    assert rig.discovery.calls == 2 and rig.sched.state() == "sampling" and rig.sched.last_error is None
    assert rig.samplers.submitted


def test_new_files_join_the_plan_at_the_next_listing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=2), discover_interval=60.0)
    rig.turn()
    assert rig.sched.planner is not None and len(rig.sched.planner) == 2
    rig.discovery.listing.update(table(files=1, groups=3, prefix="g", seq=2))
    rig.clock.advance(59.0)
    rig.turn()
    assert rig.discovery.calls == 1 and len(rig.sched.planner) == 2
    rig.clock.advance(1.0)
    rig.turn()
    assert rig.discovery.calls == 2 and len(rig.sched.planner) == 5


def test_state_names_each_phase(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.sched.state() == "discovering"
    rig.discovery.fail = "down"
    rig.turn()
    assert rig.sched.state() == "remote error"
    rig.discovery.fail = None
    rig.clock.advance(rig.settings.retry_seconds)
    rig.turn()
    assert rig.sched.state() == "sampling"
    rig.sched.set_paused(True)
    assert rig.sched.state() == "paused"


def test_coverage_counts_ingested_units_and_leaves_out_given_up_and_quarantined(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=2, groups=2), samplers=2)
    rig.turn()
    cov = rig.sched.coverage()
    assert cov is not None and (cov["units"], cov["units_sampled"], cov["rows"]) == (4, 0, 40)
    rig.sample_ok()
    rig.turn(2)  # the result, then its ingest
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_sampled"] == 1 and cov["unit_fraction"] == 0.25
    assert cov["rows_sampled"] == 10 and cov["units_left_out"] == 0
    other = next(p for p in rig.catalog.files() if p != rig.take().path)
    rig.sched.quarantine(other, "unparsable")
    rig.sched.given_up.add((rig.take().path, rig.take().row_group))
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_left_out"] == 3 and cov["rows_left_out"] == 30


# ----------------------------------------------------------------------------- pacing
def test_rate_cap_holds_a_unit_until_the_bucket_refills(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=3, rg_bytes=800), samplers=2, max_ingest_rate=1000)
    rig.turn()
    assert len(rig.samplers.submitted) == 1  # 800 of the 1000 tokens spent: the next 800 must wait
    assert rig.sched.paused_reason is not None and rig.sched.paused_reason.startswith("max_ingest_rate")
    assert rig.sched.state() == "paused"
    rig.clock.advance(0.5)  # 200 + 500 tokens < 800
    rig.turn()
    assert len(rig.samplers.submitted) == 1 and "max_ingest_rate" in str(rig.sched.paused_reason)
    rig.clock.advance(0.11)  # 810 tokens
    rig.turn()
    assert len(rig.samplers.submitted) == 2
    rig.clock.advance(1.0)
    rig.turn()
    assert len(rig.samplers.submitted) == 3  # the refused unit was not lost: every unit is sent once
    assert len(set(rig.units(rig.samplers.submitted))) == 3


def test_full_cache_waits_for_an_epoch_share_before_replacing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=4, rg_bytes=100_000), samplers=2, max_bytes=1 << 20,
              pacing="epoch", replace_per_epoch=0.25)
    rig.catalog.resident_bytes = 1 << 20  # full: a new unit replaces old samples
    rig.turn()
    assert rig.samplers.submitted == []
    assert rig.sched.paused_reason is not None and rig.sched.paused_reason.startswith("cache full: replacing")
    rig.turn()
    assert rig.samplers.submitted == []
    # one share: 262144 bytes, room for two 100000-byte units
    rig.traffic.epoch_started({"default": rig.budget.max_bytes})
    rig.turn()
    assert len(rig.samplers.submitted) == 2
    assert str(rig.sched.paused_reason).startswith("cache full: replacing")


def test_pacing_off_replaces_a_full_cache_at_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=4, rg_bytes=100_000), samplers=2, max_bytes=1 << 20, pacing="off")
    rig.catalog.resident_bytes = 1 << 20
    rig.turn()
    assert len(rig.samplers.submitted) == 4 and rig.sched.paused_reason is None


# ----------------------------------------------------------------------------- pause / drain
def test_pause_stops_new_units_but_drains_those_out_and_resume_restarts(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=6), samplers=1)
    rig.turn()
    assert len(rig.samplers.submitted) == 2
    done = rig.sched.call(lambda: rig.sched.set_paused(True))
    assert not done.done()  # runs on the scheduler's turn
    rig.turn()
    assert done.done() and rig.sched.user_paused
    assert rig.sched.paused_reason == "paused by request" and rig.sched.state() == "paused"
    rig.sample_ok()
    rig.sample_ok()
    rig.turn(3)
    assert len(rig.samplers.submitted) == 2  # nothing new while paused ...
    assert rig.catalog.resident_units() == 2  # ... but what was out is still ingested
    rig.sched.call(lambda: rig.sched.set_paused(False))
    rig.turn()
    assert not rig.sched.user_paused and rig.sched.state() == "sampling"
    assert len(rig.samplers.submitted) == 4


# ----------------------------------------------------------------------------- failures
def test_transient_failure_is_retried_with_exponential_backoff(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1), retry_seconds=4.0)
    rig.turn()
    for attempt in (1, 2, 3):
        rig.fail("transient", "throttled")
        rig.turn()
        assert rig.sched.unit_failures["transient"] == attempt
        assert str(rig.sched.paused_reason).startswith("waiting to retry 1 unit(s) after failures")
        assert "throttled" in str(rig.sched.paused_reason)
        wait_and_resubmit(rig, 4.0 * 2 ** (attempt - 1))
    assert len(set(rig.units(rig.samplers.submitted))) == 1
    rig.sample_ok()
    rig.turn(2)
    assert rig.catalog.resident_units() == 1 and rig.sched.units_given_up == 0


def test_backoff_is_capped_at_max_unit_backoff(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1), retry_seconds=100.0)
    rig.turn()
    sent = len(rig.samplers.submitted)
    for base in (100.0, 200.0, MAX_UNIT_BACKOFF, MAX_UNIT_BACKOFF):  # 400 s and 800 s uncapped
        rig.fail("transient")
        rig.turn()
        wait_and_resubmit(rig, base)  # asserts: not re-sent before 0.75 x base, re-sent by 1.25 x base
    assert MAX_UNIT_BACKOFF < 400.0 and len(rig.samplers.submitted) == sent + 4


def test_unit_is_given_up_after_max_attempts_and_tried_again_next_pass(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1), retry_seconds=1.0)
    rig.turn()
    for attempt in range(1, MAX_UNIT_ATTEMPTS + 1):
        failed = rig.fail("transient", "403 Forbidden")
        rig.turn()
        if attempt < MAX_UNIT_ATTEMPTS:
            assert rig.sched.units_given_up == 0
            rig.clock.advance(MAX_UNIT_BACKOFF * JITTER[1])
            rig.turn()
            assert rig.take().cycle == 0
    key = (failed.path, failed.row_group)
    assert rig.sched.units_given_up == 1 and key in rig.sched.given_up
    assert rig.sched.unit_failures["transient"] == MAX_UNIT_ATTEMPTS
    assert rig.writer.files_put == []  # nothing says its bytes are bad: not quarantined
    assert rig.writer.metas and rig.writer.metas[-1]["cursor"]["cycle"] == 0  # done for this pass
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_left_out"] == 1
    again = rig.take()
    assert (again.path, again.row_group) == key and again.cycle == 1  # the next pass tries it again ...
    rig.fail("transient")
    rig.turn()
    wait_and_resubmit(rig, 1.0)  # ... with its attempts counted from one again
    rig.sample_ok()
    rig.turn()
    assert key not in rig.sched.given_up


def test_unreachable_backs_off_everything_and_never_gives_up(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=3), samplers=1, retry_seconds=10.0)
    rig.turn()
    for n in range(1, MAX_UNIT_ATTEMPTS + 3):
        rig.fail("unreachable", "ConnectTimeout")
        rig.turn()
        assert rig.sched.paused_reason == "remote unreachable: backing off"
        sent = len(rig.samplers.submitted)
        rig.clock.advance(9.5)
        rig.turn()
        assert len(rig.samplers.submitted) == sent
        rig.clock.advance(0.5)
        rig.turn()
        assert len(rig.samplers.submitted) == sent + 1 and rig.sched.paused_reason is None
        assert rig.sched.unit_failures["unreachable"] == n
    assert rig.sched.units_given_up == 0 and rig.sched.given_up == set()


def test_unit_failures_are_counted_by_kind(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=4, groups=2), samplers=4, min_free_disk=0)
    rig.turn()
    for kind in ("transient", "transient", "corrupt", "changed", None, "unreachable", "disk"):
        rig.fail(kind)
    rig.turn()
    assert dict(rig.sched.unit_failures) == {"transient": 3, "corrupt": 1, "changed": 1, "unreachable": 1,
                                             "disk": 1}
    assert rig.sched.remote_errors == 7


def test_changed_file_is_listed_again_at_once_and_its_unit_retried(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1), discover_interval=3600.0)
    rig.turn()
    rig.fail("changed", "the file changed since it was listed")
    rig.turn()
    assert rig.discovery.calls == 2  # listed again in the same turn, not an hour later
    assert rig.writer.files_put == []
    wait_and_resubmit(rig, rig.settings.retry_seconds)


def test_sampler_death_is_retried_never_quarantined(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1))
    rig.turn()
    for attempt in range(1, CORRUPT_CONFIRMATIONS + 2):
        # what Supervisor._replace reports for the task of a sampler process that died
        rig.fail("transient", "sampler process died with exit code -9")
        rig.turn()
        assert rig.writer.files_put == [] and not rig.catalog.file(rig.samplers.submitted[0].path).quarantined
        assert rig.sched.unit_failures["transient"] == attempt
        wait_and_resubmit(rig, rig.settings.retry_seconds * 2 ** (attempt - 1))


# ----------------------------------------------------------------------------- quarantine
def test_corrupt_read_confirmed_quarantines_the_file(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=2), samplers=1)  # both units out at once: a free slot for the retry
    rig.turn()
    first = rig.fail("corrupt", "ArrowInvalid: bad thrift")
    rig.turn()
    assert rig.writer.files_put == []  # one unparsable read is not enough ...
    assert not rig.catalog.file(first.path).quarantined
    wait_and_resubmit(rig, 1.0)  # ... it is read again soon to confirm
    assert rig.samplers.queue[-1].key == first.key
    while rig.take().key != first.key:
        rig.sample_ok()
    for _ in range(CORRUPT_CONFIRMATIONS - 1):
        rig.fail("corrupt", "ArrowInvalid: bad thrift")
    rig.turn()
    assert len(rig.writer.files_put) == 1 and list(rig.writer.files_put[0]) == [first.path]
    info = rig.catalog.file(first.path)
    assert info.quarantined and info.kind == "corrupt" and "bad thrift" in info.reason
    assert info.row_groups == (10, 10) and info.size == 5000  # the file's facts are kept
    assert rig.sched.quarantined_units == 2  # both units of the file
    assert rig.sched.unit_failures["corrupt"] == CORRUPT_CONFIRMATIONS
    rig.turn(3)
    assert len(rig.writer.files_put) == 1
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_left_out"] == 2


def test_corrupt_reads_not_in_a_row_do_not_quarantine(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1))
    rig.turn()
    for kind in ("corrupt", "transient", "corrupt"):  # the transient failure in between resets the count
        rig.fail(kind)
        rig.turn()
        rig.clock.advance(MAX_UNIT_BACKOFF * JITTER[1])
        rig.turn()
    assert rig.writer.files_put == [] and rig.sched.unit_failures["corrupt"] == 2
    rig.fail("corrupt")
    rig.turn()
    assert len(rig.writer.files_put) == 1  # two in a row now


def test_schema_mismatch_quarantines_at_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1))
    rig.turn()
    t = rig.fail("schema", "SchemaConflict: uint64 beyond int64")
    rig.turn()
    info = rig.catalog.file(t.path)
    assert info.quarantined and info.kind == "schema"
    assert rig.writer.metas and rig.writer.metas[-1]["cursor"]["cycle"] == 0
    assert rig.sched.complete
    rig.turn()
    assert "quarantined" in str(rig.sched.paused_reason)


def test_quarantining_a_quarantined_file_writes_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1))
    rig.turn()
    path = rig.take().path
    rig.sched.quarantine(path, "first")
    rig.sched.quarantine(path, "second")
    assert len(rig.writer.files_put) == 1 and rig.catalog.file(path).reason == "first"


# ----------------------------------------------------------------------------- ingest
def test_shard_that_does_not_fit_is_held_and_retried_while_sampling_pauses(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=4), samplers=1)
    rig.pins.extend([3, 1])
    rig.turn()
    nope = NoRoom(500, EvictionPlan((), 0, False))
    rig.writer.outcomes = [nope, nope]
    t = rig.sample_ok(nbytes=500)
    rig.turn()  # the result: its shard goes to the writer, which says NoRoom
    rig.turn()  # the NoRoom: the shard is held (and tried again at once)
    reason = str(rig.sched.paused_reason)
    assert reason.startswith("budget full: every evictable shard is pinned by leases on epochs [1, 3]")
    assert "1 shard(s) wait" in reason
    sent = len(rig.samplers.submitted)
    rig.turn(3)  # the second NoRoom; the retry waits 0.5 s
    assert len(rig.writer.ingested) == 2 and len(rig.samplers.submitted) == sent
    assert "the smallest 500 bytes" in str(rig.sched.paused_reason)
    rig.pins.clear()
    rig.clock.advance(0.5)
    rig.turn(2)  # the held shard is ingested at the third try: its unit is not sampled again
    assert rig.writer.ingested == [rig.writer.ingested[0]] * 3
    assert rig.catalog.unit_resident(t.path, t.row_group)
    assert rig.sched.paused_reason is None and len(rig.samplers.submitted) == sent + 1
    assert rig.units(rig.samplers.submitted).count((t.path, t.row_group)) == 1
    assert all(m == rig.make_room for m in rig.writer.make_rooms)  # the daemon's eviction plan is used


def test_nothing_pinned_yet_no_room_says_so(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=2), samplers=1)
    rig.turn()
    rig.writer.outcomes = [NoRoom(100, EvictionPlan((), 0, False))] * 2
    rig.sample_ok()
    rig.turn(2)
    assert "nothing is pinned, yet the shard does not fit" in str(rig.sched.paused_reason)


def test_failed_ingest_sets_the_staged_file_aside_and_samples_the_unit_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1))
    rig.turn()
    t = rig.take()
    result = rig.ok(t)
    staged = Path(str(result.staged))
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"damaged")
    rig.writer.outcomes = [DamagedShard(staged, 0, "checksum")]
    rig.answer(result)
    rig.turn(2)
    assert not staged.exists() and (staged.parent / "rejected" / staged.name).exists()
    assert str(rig.sched.last_error).startswith("ingest failed: DamagedShard")
    assert not rig.catalog.unit_resident(t.path, t.row_group)
    wait_and_resubmit(rig, rig.settings.retry_seconds)
    assert rig.take().key == t.key


def test_lmdb_panic_stops_the_daemon(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1))
    rig.turn()
    rig.writer.outcomes = [lmdb.PanicError("MDB_PANIC")]
    rig.sample_ok()
    rig.turn(2)
    assert len(rig.died) == 1 and "LMDB environment cannot go on" in rig.died[0]
    assert not rig.sched.complete and rig.catalog.resident_units() == 0


def test_result_in_several_parts_is_one_shard_each_and_one_unit_done_with_its_last(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=2), samplers=1)
    rig.turn()
    t = rig.take()
    rig.writer.outcomes = [None, None, NoRoom(70, EvictionPlan((), 0, False))]  # the last part waits for room
    rig.answer(rig.ok(t, nbytes=70, parts=3))
    rig.turn()
    assert [Path(p).name for p in rig.writer.ingested[:3]] == [f"{t.key}-p{k}.shard" for k in range(3)]
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_sampled"] == 0  # not done before its last part is in
    rig.turn()
    assert rig.catalog.resident_bytes == 210 and len(rig.writer.ingested) == 4
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_sampled"] == 1


@pytest.mark.parametrize("failed", [0, 1, 2])
def test_a_part_that_fails_to_ingest_has_its_unit_sampled_again_until_every_part_is_in(tmp_path: Path,
                                                                                      failed: int) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1), samplers=1)
    rig.turn()
    t = rig.take()
    rig.writer.outcomes = [RuntimeError("lmdb said no") if k == failed else None for k in range(3)]
    rig.answer(rig.ok(t, nbytes=70, parts=3))
    rig.turn()
    assert rig.catalog.resident_bytes == 140  # two parts in, one failed
    assert rig.sched.unit_failures["ingest"] == 1
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_sampled"] == 0, "a unit with a part missing is not done"
    assert not rig.sched.complete
    rig.clock.advance(rig.settings.retry_seconds * JITTER[1])
    rig.turn()
    again = rig.take()
    assert again.key == t.key, "the unit is sampled again, though parts of it are resident"
    rig.answer(rig.ok(again, nbytes=70, parts=3))
    rig.turn(2)
    assert rig.catalog.resident_bytes == 210  # the missing part; the two resident ones skipped by their keys
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_sampled"] == 1


def test_failed_ingests_are_counted_and_given_up_after_max_attempts(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1))
    rig.turn()
    for attempt in range(1, MAX_UNIT_ATTEMPTS + 1):
        rig.writer.outcomes = [RuntimeError("lmdb said no")]
        rig.sample_ok()
        rig.turn()
        assert rig.sched.unit_failures["ingest"] == attempt
        rig.clock.advance(MAX_UNIT_BACKOFF * JITTER[1])
        rig.turn()
    assert rig.sched.units_given_up == 1
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_left_out"] == 1


def test_unreachable_between_corrupt_reads_breaks_the_run(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1))
    rig.turn()
    for kind in ("corrupt", "unreachable", "corrupt"):
        rig.fail(kind)
        rig.turn()
        rig.clock.advance(MAX_UNIT_BACKOFF * JITTER[1])
        rig.turn()
    assert rig.writer.files_put == [], "corrupt, unreachable, corrupt is not two unparsable reads in a row"


def test_the_confirming_read_waits_about_a_second_after_earlier_transient_failures(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1))
    rig.turn()
    for _ in range(4):
        rig.fail("transient")
        rig.turn()
        rig.clock.advance(MAX_UNIT_BACKOFF * JITTER[1])
        rig.turn()
    rig.fail("corrupt")
    rig.turn()
    assert rig.sched.unit_failures["transient"] == 4 and rig.sched.unit_failures["corrupt"] == 1
    wait_and_resubmit(rig, 1.0)  # about 1 s, not 2^4 s


def test_empty_unit_is_done_without_a_shard(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=2), samplers=1)
    rig.turn()
    t = rig.take()
    rig.answer(SampleResult(task=t, ok=True))  # a row group of no rows: nothing staged
    rig.turn()
    assert rig.writer.ingested == []
    assert rig.writer.metas and rig.writer.metas[-1]["cursor"]["cycle"] == 0
    cov = rig.sched.coverage()
    assert cov is not None and cov["units_sampled"] == 1


def test_results_settle_the_traffic_books(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=2, rg_bytes=300), samplers=1)
    rig.turn()
    assert rig.traffic.out_bytes() == 600
    rig.sample_ok(nbytes=250)
    rig.fail("transient")
    rig.turn()
    assert rig.traffic.out_bytes() == 0 and rig.traffic.sampler_totals() == (250, 0)


# ----------------------------------------------------------------------------- disk
def test_low_free_disk_pauses_until_there_is_room(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=2), min_free_disk=1000)
    rig.disk.free_bytes = 999
    rig.turn()
    assert rig.samplers.submitted == []
    assert rig.sched.paused_reason == "disk almost full: 999 bytes free < min_free_disk 1000"
    rig.disk.free_bytes = 1000
    rig.turn()
    assert len(rig.samplers.submitted) == 2 and rig.sched.paused_reason is None


def test_too_little_filesystem_space_for_staging_pauses_unless_the_guard_is_off(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=2), samplers=2, min_free_disk=1000)
    rig.disk.fs_free = 2 * rig.settings.part_bytes - 1
    rig.turn()
    assert rig.samplers.submitted == [] and "less than the staging files of 2 sampler(s)" in str(
        rig.sched.paused_reason)
    off = Rig(tmp_path, table(files=1, groups=2), samplers=2, min_free_disk=0)
    off.disk.fs_free = off.disk.free_bytes = 0
    off.turn()
    assert len(off.samplers.submitted) == 2 and off.sched.paused_reason is None


def test_disk_full_while_staging_pauses_then_retries_the_unit(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1), min_free_disk=1000, retry_seconds=5.0)
    rig.turn()
    t = rig.fail("disk", "OSError: [Errno 28] No space left on device")
    rig.disk.free_bytes = 10
    rig.turn()
    assert str(rig.sched.paused_reason).startswith("disk full while staging a shard")
    rig.disk.free_bytes = 1 << 30  # room again, but the backoff is not over
    rig.clock.advance(4.5)
    rig.turn()
    assert rig.sched.disk_full is not None and len(rig.samplers.submitted) == 1
    rig.clock.advance(0.5)
    rig.turn()
    assert rig.sched.disk_full is None and rig.sched.paused_reason is None
    assert rig.units(rig.samplers.submitted) == [(t.path, t.row_group)] * 2
    assert rig.sched.units_given_up == 0 and rig.writer.files_put == []


def test_disk_full_while_ingesting_holds_the_shard_until_room(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1), retry_seconds=5.0)
    rig.turn()
    rig.writer.outcomes = [OSError(errno.ENOSPC, "No space left on device")]
    t = rig.sample_ok()
    rig.turn(2)
    assert str(rig.sched.paused_reason).startswith("disk full while ingesting")
    assert len(rig.writer.ingested) == 1
    rig.clock.advance(4.5)
    rig.turn()
    assert len(rig.writer.ingested) == 1  # the held shard waits out the backoff
    rig.clock.advance(0.5)
    rig.turn(2)
    assert len(rig.writer.ingested) == 2 and rig.catalog.unit_resident(t.path, t.row_group)
    assert len(rig.samplers.submitted) == 1  # the shard was kept: its unit is not sampled again
    assert rig.sched.complete


def test_a_full_disk_is_logged_once_and_space_back_only_once_a_shard_is_written(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every retry used to say "disk space is back" (every --retry-seconds, while the writes kept failing)."""
    rig = Rig(tmp_path, table(files=1, groups=1), retry_seconds=5.0)
    rig.turn()
    enospc = OSError(errno.ENOSPC, "No space left on device")
    rig.writer.outcomes = [enospc, enospc, enospc]
    caplog.set_level(logging.INFO, logger="samplecache.daemon")
    t = rig.sample_ok()
    rig.turn(2)
    for _ in range(3):  # two failed retries, then one that writes the shard
        rig.clock.advance(5.0)
        rig.turn(2)
    assert len(rig.writer.ingested) == 4 and rig.catalog.unit_resident(t.path, t.row_group)
    events = [getattr(r, "event", None) for r in caplog.records if getattr(r, "event", None) in (
        "disk_full", "disk_space_back")]
    assert events == ["disk_full", "disk_space_back"], [r.getMessage() for r in caplog.records]


# ----------------------------------------------------------------------------- completion
def test_every_unit_resident_is_complete_and_an_eviction_resumes(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=2, groups=2), samplers=2)
    rig.turn()
    while rig.samplers.queue:
        rig.sample_ok(nbytes=100)
        rig.turn(2)
    assert rig.catalog.resident_units() == 4 and rig.sched.complete
    cov = rig.sched.coverage()
    assert cov is not None and cov["cycle"] == 1  # found at the first pass of skips, not one pass later
    assert rig.sched.paused_reason == "the whole remote dataset is cached" and rig.sched.state() == "paused"
    assert len(rig.samplers.submitted) == 4
    rig.turn(3)
    assert len(rig.samplers.submitted) == 4  # complete: nothing is sampled again
    path, row_group = rig.units(rig.samplers.submitted)[0]
    rig.catalog.evict_unit(path, row_group, 100)
    rig.turn()
    assert not rig.sched.complete
    assert rig.units(rig.samplers.submitted[4:]) == [(path, row_group)]  # only the unit that left


def test_complete_with_quarantined_files_says_they_are_left_out(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=2, groups=1), samplers=1)
    rig.turn()
    rig.fail("schema", "SchemaConflict: no")
    rig.sample_ok()
    rig.turn(3)
    assert rig.sched.complete and rig.sched.quarantined_units == 1
    assert rig.sched.paused_reason is not None and rig.sched.paused_reason.startswith(
        "every readable unit is cached; 1 unit(s) of quarantined files are left out")


def test_files_quarantined_at_discovery_are_left_out_of_coverage(tmp_path: Path) -> None:
    # two files whose footers could not be read: quarantined by discovery, with no row groups and no units
    listing = {**table(files=2, groups=2), **{
        f"{SOURCE}/unread{i}.parquet": FileInfo(seq=10 + i).quarantine("unreadable footer: ArrowInvalid")
        for i in range(2)}}
    rig = Rig(tmp_path, listing, samplers=2)
    rig.turn()
    while rig.samplers.queue:
        rig.sample_ok()
        rig.turn(2)
    rig.turn()
    assert rig.sched.complete and rig.sched.quarantined_units == 0
    cov = rig.sched.coverage()
    assert cov is not None and cov["files_unread"] == 2, cov
    # each unread file: one unit left out, with the rows of the mean file here (2 files of 20 rows)
    assert (cov["units"], cov["units_sampled"], cov["units_left_out"]) == (6, 4, 2), cov
    assert (cov["rows"], cov["rows_sampled"], cov["rows_left_out"]) == (80, 40, 40), cov
    assert cov["unit_fraction"] < 1.0 and cov["row_fraction"] == 0.5, cov
    assert rig.sched.paused_reason == ("every readable unit is cached; 2 quarantined file(s) whose footer cannot "
                                       "be read are left out (GET /v1/quarantine)")


def test_a_new_file_ends_completion(tmp_path: Path) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1), discover_interval=60.0)
    rig.turn()
    rig.sample_ok()
    rig.turn(2)
    assert rig.sched.complete
    rig.discovery.listing.update(table(files=1, groups=1, prefix="g", seq=2))
    rig.clock.advance(60.0)
    rig.sched.discover()
    assert not rig.sched.complete  # at the listing, before any unit is looked at
    rig.turn()
    assert len(rig.samplers.submitted) == 2 and rig.samplers.submitted[-1].path.endswith("g0.parquet")


# ----------------------------------------------------------------------------- control
def test_count_evicted_is_counted_on_the_scheduler_turn(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    fut: Future[tuple[int, ...]] = Future()
    fut.set_result((4, 5, 6))
    rig.sched.count_evicted(fut)
    assert rig.sched.evicted_shards == 0
    rig.turn()
    assert rig.sched.evicted_shards == 3


@pytest.mark.parametrize("paused", [True, False])
def test_refresh_reason_recomputes_without_sampling(tmp_path: Path, paused: bool) -> None:
    rig = Rig(tmp_path, table(files=1, groups=1), min_free_disk=1000)
    rig.turn()
    rig.sched.user_paused = paused
    rig.disk.free_bytes = 5
    rig.sched.refresh_reason()
    assert rig.sched.paused_reason == ("paused by request" if paused else
                                       "disk almost full: 5 bytes free < min_free_disk 1000")
    assert len(rig.samplers.submitted) == 1


def test_a_listing_plans_only_files_not_planned_yet_on_any_node(tmp_path: Path) -> None:
    """On one of two nodes, a file whose units are all the other node's is planned once, not found new again at
    every listing (which would grow all_units and undo complete); a file another source of the same table read
    into the catalog first (a file the discovery does not report as new) is planned at the next listing."""
    listing = table(files=12, groups=1)
    rig = Rig(tmp_path, listing, num_nodes=2, node_rank=0, discover_interval=60.0)
    rig.turn()
    planner = rig.sched.planner
    assert planner is not None and planner.all_units == 12 and 0 < len(planner) < 12  # some are the other node's
    assert planner.paths == set(listing)
    for _ in range(3):
        rig.clock.advance(61.0)
        rig.turn()
    assert planner.all_units == 12 and planner.paths == set(listing)
    extra = table(files=1, groups=2, prefix="g", seq=20)
    for p, info in extra.items():  # read by another source: in the catalog, yet not new to this discovery
        rig.catalog.set_file(p, info)
    rig.clock.advance(61.0)
    rig.turn()
    assert planner.all_units == 14 and planner.paths == set(listing) | set(extra)
