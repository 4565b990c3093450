"""service/samplecache_service/sampling/supervisor.py: the sampler process pool (spawned workers, death -> failed
result + replacement, stop)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
from paths import SUPPORT
from supervisor_targets import BROKEN_IMPORT, close_fds_then_exit, crash_or_echo, echo, make_task, sleep_then_echo

from samplecache_service.sampling.respawn import RespawnPolicy
from samplecache_service.sampling.sampler import SampleResult
from samplecache_service.sampling.supervisor import Supervisor


class Results:
    def __init__(self) -> None:
        self.items: list[SampleResult] = []
        self._cv = threading.Condition()

    def __call__(self, r: SampleResult) -> None:
        with self._cv:
            self.items.append(r)
            self._cv.notify_all()

    def wait(self, n: int, timeout: float = 15.0) -> list[SampleResult]:
        with self._cv:
            ok = self._cv.wait_for(lambda: len(self.items) >= n, timeout)
        assert ok, f"only {len(self.items)} of {n} results after {timeout}s: {self.items}"
        return list(self.items)

    def by_key(self) -> dict[str, SampleResult]:
        return {r.task.key: r for r in self.items}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead, merely not reaped
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _worker_pids(sup: Supervisor) -> list[int]:
    return [w.proc.pid for w in sup._workers if w.proc.pid is not None]


@pytest.fixture(autouse=True)
def _importable_targets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Spawned children unpickle ``supervisor_targets.<fn>`` by reference: make sure they can import it."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(SUPPORT), os.environ.get("PYTHONPATH")) if p))
    yield
    assert mp.active_children() == [], "a test left sampler processes behind"


@pytest.fixture()
def pools() -> Iterator[list[Supervisor]]:
    made: list[Supervisor] = []
    yield made
    for s in made:  # stop whatever a failing test left running
        if s._workers:
            s.stop(timeout=2)


def test_results_for_all_submitted_tasks(pools: list[Supervisor]) -> None:
    results = Results()
    sup = Supervisor(2, results, target=echo)
    pools.append(sup)
    sup.start()
    pids = _worker_pids(sup)
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    assert os.getpid() not in pids
    tasks = [make_task(f"t{i}", row_group=i) for i in range(12)]
    for t in tasks:
        sup.submit(t)
    got = results.wait(len(tasks))
    assert sorted(r.task.key for r in got) == sorted(t.key for t in tasks)
    assert all(r.ok for r in got)
    assert {r.task.key: r.rows for r in got} == {t.key: t.row_group for t in tasks}
    assert {r.extra["pid"] for r in got} <= set(pids)  # ran in the pool's processes, not here
    assert sup.restarts == 0
    deadline = time.monotonic() + 5
    while sup.pending() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sup.pending() == 0 and sup.running() == []
    assert sup.stop() == []
    assert not any(_alive(p) for p in pids)
    assert sup._thread is not None and not sup._thread.is_alive()


def test_worker_death_is_a_failed_result_and_the_worker_is_replaced(pools: list[Supervisor]) -> None:
    results = Results()
    sup = Supervisor(1, results, target=crash_or_echo)
    pools.append(sup)
    sup.start()
    first_pid = _worker_pids(sup)[0]
    sup.submit(make_task("before"))
    before = results.wait(1)[0]
    assert before.ok and before.extra["pid"] == first_pid
    sup.submit(make_task("boom", path="crash"))
    for i in range(3):
        sup.submit(make_task(f"after{i}", row_group=i))
    got = results.wait(5)
    by_key = results.by_key()
    assert set(by_key) == {"before", "boom", "after0", "after1", "after2"}
    boom = by_key["boom"]
    assert boom.ok is False
    assert boom.task.key == "boom" and boom.task.path == "crash"
    # The exact code (3) is not asserted here: it is racy today, see test_the_exit_code_is_reported below.
    assert boom.error is not None and "exit code" in boom.error and "died" in boom.error
    assert boom.error_kind == "transient"
    assert sup.restarts == 1
    assert sup.start_failures == 0 and sup.crash_loop() is None  # it died in a task, after a clean start
    after = [by_key[f"after{i}"] for i in range(3)]
    assert all(r.ok for r in after)
    new_pid = after[0].extra["pid"]
    assert new_pid != first_pid and {r.extra["pid"] for r in after} == {new_pid}
    assert not _alive(first_pid)
    assert _worker_pids(sup) == [new_pid]
    assert len(got) == 5  # exactly one result per task, none twice
    assert sup.stop() == []
    assert not _alive(new_pid)


def test_the_exit_code_is_reported(pools: list[Supervisor]) -> None:
    results = Results()
    sup = Supervisor(1, results, target=close_fds_then_exit)
    pools.append(sup)
    sup.start()
    sup.submit(make_task("boom", path="crash"))
    boom = results.wait(1)[0]
    assert boom.ok is False and sup.restarts == 1
    assert boom.error is not None and "exit code 3" in boom.error, boom.error
    sup.stop()


def test_stop_returns_unfinished_tasks_and_leaves_no_children(pools: list[Supervisor]) -> None:
    results = Results()
    sup = Supervisor(2, results, target=sleep_then_echo)
    pools.append(sup)
    sup.start()
    pids = _worker_pids(sup)
    sup.submit(make_task("quick", path="0"))
    results.wait(1)
    slow = [make_task(f"slow{i}", path="60") for i in range(2)]
    queued = [make_task(f"queued{i}", path="0") for i in range(3)]
    for t in slow + queued:
        sup.submit(t)
    deadline = time.monotonic() + 10
    while len(sup.running()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted(t.key for t in sup.running()) == ["slow0", "slow1"]
    assert sup.pending() == 5
    t0 = time.monotonic()
    unfinished = sup.stop(timeout=1.0)
    took = time.monotonic() - t0
    assert sorted(t.key for t in unfinished) == sorted(t.key for t in slow + queued)
    assert took < 8, f"stop() took {took:.1f}s"
    assert not any(_alive(p) for p in pids)
    assert mp.active_children() == []
    assert [r.task.key for r in results.items] == ["quick"]  # nothing delivered after stop
    time.sleep(0.2)
    assert [r.task.key for r in results.items] == ["quick"]


def test_an_idle_worker_killed_from_outside_is_replaced_without_a_result(pools: list[Supervisor]) -> None:
    results = Results()
    sup = Supervisor(1, results, target=echo)
    pools.append(sup)
    sup.start()
    old = _worker_pids(sup)[0]
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while sup.restarts < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sup.restarts == 1
    assert results.items == []  # it had no task: nothing to report
    assert sup.start_failures == 0  # killed from outside (even before it was ready) is not a failure to start
    sup.submit(make_task("x"))
    r = results.wait(1)[0]
    assert r.ok and r.extra["pid"] != old
    assert sup.stop() == []


def test_a_failing_result_handler_does_not_kill_the_pool(pools: list[Supervisor]) -> None:
    seen: list[str] = []
    done = threading.Event()

    def handler(r: SampleResult) -> None:
        seen.append(r.task.key)
        if len(seen) == 3:
            done.set()
        if r.task.key == "bad":
            raise RuntimeError("handler bug")

    sup = Supervisor(1, handler, target=echo)
    pools.append(sup)
    sup.start()
    for k in ("a", "bad", "c"):
        sup.submit(make_task(k))
    assert done.wait(15), seen
    assert seen == ["a", "bad", "c"]
    assert sup._thread is not None and sup._thread.is_alive()
    assert sup.restarts == 0
    assert sup.stop() == []


def test_pool_size_is_at_least_one() -> None:
    assert Supervisor(0, lambda r: None, target=echo).size == 1
    assert Supervisor(-3, lambda r: None, target=echo).size == 1


def _until(cond: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not true after {timeout}s"
        time.sleep(0.02)


def test_samplers_that_die_at_start_are_restarted_with_backoff_a_crash_loop_and_recover(
        pools: list[Supervisor], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    broken = tmp_path / "broken"
    broken.touch()
    monkeypatch.setenv(BROKEN_IMPORT, str(broken))  # every new sampler dies importing its target (exit code 1)
    policy = RespawnPolicy(first_delay=0.25, max_delay=2.0, loop_failures=4, loop_window=30.0)
    results = Results()
    sup = Supervisor(2, results, target=echo, respawn=policy)
    pools.append(sup)
    caplog.set_level(logging.INFO, logger="samplecache.supervisor")
    sup.start()
    sup.submit(make_task("waits"))
    _until(lambda: sup.crash_loop() is not None)
    problem = sup.problem()
    assert problem is not None and "crash at start" in problem and "exited with code 1 before it was ready" in problem
    _until(lambda: [getattr(r, "event", None) for r in caplog.records].count("sampler_crash_loop") == 1)
    # backed off, not respawned at once: two slots over 3 s at the 2 s cap start at most 2 x 2 more
    _until(lambda: sup.respawn.in_a_row >= 8)
    before, t0 = sup.start_failures, time.monotonic()
    time.sleep(3.0)
    assert sup.start_failures - before <= 2 * (int((time.monotonic() - t0) / policy.max_delay) + 1)
    delays = [float(r.getMessage().rsplit(" in ", 1)[1].rstrip("s")) for r in caplog.records
              if getattr(r, "event", None) == "sampler_start_failed"]
    assert delays[:3] == [0.25, 0.5, 1.0] and max(delays) == policy.max_delay
    assert results.items == []  # the queued task waits for a sampler that starts: it is not failed
    assert sup.pending() == 1
    broken.unlink()  # the install is repaired: the next start is clean
    _until(lambda: sup.crash_loop() is None)
    assert sup.problem() is None and sup.respawn.in_a_row == 0
    _until(lambda: any(getattr(r, "event", None) == "sampler_crash_loop_ended" for r in caplog.records))
    assert [getattr(r, "event", None) for r in caplog.records].count("sampler_crash_loop") == 1
    done = results.wait(1)[0]
    assert done.ok and done.task.key == "waits"
    _until(lambda: len(_worker_pids(sup)) == 2)  # both slots are back
    assert sup.stop() == []


def test_a_crash_loop_is_every_slot_failing_twice_not_one_bad_moment_of_a_large_pool() -> None:
    assert Supervisor(8, Results()).respawn.policy.loop_failures == 16
    assert Supervisor(1, Results()).respawn.policy.loop_failures == RespawnPolicy().loop_failures


def test_a_clean_start_starts_the_slots_waiting_out_a_backoff_now() -> None:
    now = [100.0]
    sup = Supervisor(3, Results(), clock=lambda: now[0])
    for _ in range(2):
        sup._start_failed("boom")  # two slots wait out their backoff
    assert all(t > now[0] for t in sup._due)

    class Ready:
        ready = False

    sup._ready(Ready())  # type: ignore[arg-type]
    assert sup._due == [now[0], now[0]] and sup.respawn.in_a_row == 0
