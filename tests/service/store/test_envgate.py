"""Closing the LMDB environment at a stop waits for the HTTP handlers inside it, and leaves it open rather than
close it under one (a closed environment's transaction or info() crashes the process)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import lmdb
import pytest

from samplecache_service.store.envgate import EnvClosed, EnvGate


def test_close_waits_for_a_reader_inside_then_lets_no_one_in(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 20)
    gate = EnvGate(env)
    inside, leave = threading.Event(), threading.Event()
    seen: list[int] = []

    def reader() -> None:
        with gate.using() as e, e.begin() as txn:
            inside.set()
            leave.wait(10)
            seen.append(txn.stat()["entries"])  # still open: the close waited

    t = threading.Thread(target=reader)
    t.start()
    assert inside.wait(10)
    threading.Timer(0.3, leave.set).start()
    began = time.monotonic()
    assert gate.close(timeout=10)
    assert time.monotonic() - began >= 0.25 and seen == [0]
    t.join(10)
    with pytest.raises(EnvClosed, match="closing"), gate.using():
        pass


def test_a_reader_that_does_not_leave_keeps_it_open(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 20)
    gate = EnvGate(env)
    inside, leave = threading.Event(), threading.Event()

    def reader() -> None:
        with gate.using() as e, e.begin():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=reader)
    t.start()
    assert inside.wait(10)
    assert not gate.close(timeout=0.2)
    assert env.info()["map_size"] == 1 << 20  # left open: still usable
    leave.set()
    t.join(10)
    assert not gate.close(timeout=1, others_done=False)  # a thread of the daemon's did not end: left open too
    assert env.stat() is not None
    env.close()
