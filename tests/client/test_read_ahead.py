"""Reading ahead in process: the prefetch thread stops at once when the consumer does, a copy part no copy thread
has started is copied by the caller (``gather.copy_all``), and the LMDB remap gate (``transactions.Gate``): a remap
waits until no other thread of the process is inside a read transaction, and no transaction begins meanwhile. Unit
tests, no daemon; the large-batch path end to end (every value checked) is in test_bufferpool.py.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np
import pytest

from samplecache.reading import prefetch
from samplecache.reading.blocks import gather, transactions


def test_closing_the_consumer_stops_a_producer_waiting_to_put_at_once() -> None:
    made: list[int] = []

    def items() -> Iterator[int]:
        for i in range(100):
            made.append(i)
            yield i

    it = prefetch.prefetched(items(), depth=1)
    assert next(it) == 0
    time.sleep(0.05)  # the producer has filled the queue and waits to put the next item
    t0 = time.monotonic()
    it.close()
    assert time.monotonic() - t0 < 0.09  # not the producer's 0.1 s put timeout
    assert len(made) < 5


def test_a_copy_part_no_thread_started_is_copied_by_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy machine the copy thread may not run for a while: the caller does not wait for it."""
    release = threading.Event()
    pool = ThreadPoolExecutor(1)
    pool.submit(release.wait, 30)  # the only copy thread is busy
    monkeypatch.setattr(gather, "_pool", lambda: pool)
    try:
        src = np.arange(8 * (1 << 18), dtype=np.float32).reshape(8, -1)  # 8 MiB: split over threads
        dst = np.empty_like(src)
        gather.copy_all([(dst[i], src[i]) for i in range(8)], threads=2)  # returns although the pool is stuck
        np.testing.assert_array_equal(dst, src)
    finally:
        release.set()
        pool.shutdown()


class _Env:
    """Records whether any transaction was open when the map was remapped."""

    def __init__(self, gate: transactions.Gate) -> None:
        self.gate, self.remaps, self.open_at_remap = gate, 0, -1

    def set_mapsize(self, size: int) -> None:
        assert size == 0
        self.remaps += 1
        self.open_at_remap = self.gate.active


def test_a_remap_waits_until_no_transaction_is_open() -> None:
    gate = transactions.Gate()
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


def test_a_group_read_ahead_that_fails_hands_over_its_items_before_the_error() -> None:
    """``prefetched_groups`` (``batching.batch_items``'s read ahead) hands over a group's items at once: a group
    whose making fails still delivers the items made before the error, then raises it, as reading item by item
    would."""
    def group(k: int) -> Iterator[int]:
        yield 10 * k
        yield 10 * k + 1
        if k == 2:
            raise ValueError("bad block in group 2")
        yield 10 * k + 2

    got: list[int] = []
    items = prefetch.prefetched_groups((group(k) for k in range(4)), 2)
    with pytest.raises(ValueError, match="bad block in group 2"):
        for x in items:
            got.append(x)
    assert got == [0, 1, 2, 10, 11, 12, 20, 21]


def test_the_first_group_is_made_in_the_callers_thread_the_rest_ahead() -> None:
    """An epoch's first batch waits for no thread to start: group 0 is made by the consumer, later ones by the
    read-ahead thread."""
    made_by: list[str] = []

    def group(k: int) -> Iterator[int]:
        made_by.append(threading.current_thread().name)
        yield k

    assert list(prefetch.prefetched_groups((group(k) for k in range(3)), 2)) == [0, 1, 2]
    assert made_by[0] == threading.current_thread().name
    assert made_by[1:] == ["samplecache-prefetch"] * 2
