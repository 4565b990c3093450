"""In-process read-ahead (``samplecache.prefetch.read_ahead``) and the LMDB remap gate it needs (``reader._Gate``).

Unit tests, no daemon: results come in order while tasks run at the same time on the read-ahead threads, a task's
error reaches the consumer, closing early waits for the tasks already running (they write into memory the caller
reuses), a read-ahead thread copies alone, and a remap waits until no other thread is inside a transaction. The
large-batch path end to end (groups of batches read this way, every value checked) is in test_bufferpool.py.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np
import pytest

from samplecache import gather, prefetch, reader


def _task(i: int, delay: float = 0.0) -> Callable[[], int]:
    def run() -> int:
        time.sleep(delay)
        return i
    return run


def test_results_come_in_order_whatever_finishes_first() -> None:
    delays = [0.03, 0.0, 0.02, 0.0, 0.01, 0.0]
    got = list(prefetch.read_ahead((_task(i, d) for i, d in enumerate(delays)), depth=3))
    assert got == list(range(len(delays)))


def test_tasks_run_at_the_same_time() -> None:
    """Two tasks that each wait for the other finish only if they run at once (on a read-ahead thread, or one on
    the consumer's when it finds its task not started yet)."""
    both = threading.Barrier(2, timeout=10)

    def meet() -> int:
        both.wait()
        return threading.get_ident()

    idents = list(prefetch.read_ahead(iter([meet, meet]), depth=2))
    assert len(set(idents)) == 2


def test_at_most_depth_tasks_are_ahead_of_the_one_taken() -> None:
    started: list[int] = []

    def tasks() -> Iterator[Callable[[], int]]:
        for i in range(10):
            started.append(i)
            yield _task(i)

    it = prefetch.read_ahead(tasks(), depth=3)
    assert next(it) == 0 and len(started) == 4
    assert next(it) == 1 and len(started) == 5
    it.close()


def _stalled_pool(monkeypatch: pytest.MonkeyPatch, module: object) -> threading.Event:
    """Make ``module._pool()`` an executor whose only thread is busy until the returned event is set."""
    release = threading.Event()
    pool = ThreadPoolExecutor(1)
    pool.submit(release.wait, 30)
    monkeypatch.setattr(module, "_pool", lambda: pool)
    return release


def test_a_task_no_thread_started_is_run_by_the_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy machine the read-ahead threads may not run for a while: the consumer does not wait for them."""
    release = _stalled_pool(monkeypatch, prefetch)
    try:
        got = list(prefetch.read_ahead((lambda i=i: (i, threading.get_ident()) for i in range(5)), depth=2))
        assert got == [(i, threading.get_ident()) for i in range(5)]
    finally:
        release.set()


def test_an_error_in_a_task_reaches_the_consumer() -> None:
    def boom() -> int:
        raise KeyError("shard 7 block 0 is missing")

    it = prefetch.read_ahead(iter([_task(0), boom, _task(2)]), depth=2)
    assert next(it) == 0
    with pytest.raises(KeyError, match="shard 7"):
        next(it)


def test_closing_early_waits_for_the_running_tasks() -> None:
    finished = threading.Event()
    running = threading.Event()

    def slow() -> int:
        running.set()
        time.sleep(0.2)
        finished.set()
        return 1

    it = prefetch.read_ahead(iter([_task(0), slow, _task(2), _task(3)]), depth=2)
    assert next(it) == 0
    assert running.wait(5)
    it.close()
    assert finished.is_set()  # close returned only after the running task was done


def test_a_read_ahead_thread_copies_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert prefetch._pool().submit(lambda: getattr(gather._HERE, "inline", False)).result(10) is True

    def no_pool() -> None:
        raise AssertionError("a read-ahead thread handed copies to the copy pool")

    monkeypatch.setattr(gather, "_pool", no_pool)
    src = np.arange(8 * (1 << 18), dtype=np.float32).reshape(8, -1)  # 8 MiB: split over threads elsewhere
    dst = np.empty_like(src)
    errors: list[BaseException] = []

    def copy() -> None:
        gather.copy_inline()
        try:
            gather.copy_all([(dst[i], src[i]) for i in range(8)], threads=4)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    t = threading.Thread(target=copy)
    t.start()
    t.join(10)
    assert not errors
    np.testing.assert_array_equal(dst, src)


def test_a_copy_part_no_thread_started_is_copied_by_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    release = _stalled_pool(monkeypatch, gather)
    try:
        src = np.arange(8 * (1 << 18), dtype=np.float32).reshape(8, -1)
        dst = np.empty_like(src)
        gather.copy_all([(dst[i], src[i]) for i in range(8)], threads=2)  # returns although the pool is stuck
        np.testing.assert_array_equal(dst, src)
    finally:
        release.set()


class _Env:
    """Records whether any transaction was open when the map was remapped."""

    def __init__(self, gate: reader._Gate) -> None:
        self.gate, self.remaps, self.open_at_remap = gate, 0, -1

    def set_mapsize(self, size: int) -> None:
        assert size == 0
        self.remaps += 1
        self.open_at_remap = self.gate.active


def test_a_remap_waits_until_no_transaction_is_open() -> None:
    gate = reader._Gate()
    env = _Env(gate)
    gate.enter()  # another thread is inside a transaction
    t = threading.Thread(target=gate.remap, args=(env,))
    t.start()
    time.sleep(0.1)
    assert env.remaps == 0 and t.is_alive()  # waiting
    entered = threading.Event()
    late = threading.Thread(target=lambda: (gate.enter(), entered.set()))
    late.start()
    time.sleep(0.05)
    assert not entered.is_set()  # no new transaction begins while a remap waits
    gate.leave()
    t.join(5)
    late.join(5)
    assert env.remaps == 1 and env.open_at_remap == 0 and entered.is_set()
    gate.leave()
    assert gate.active == 0
