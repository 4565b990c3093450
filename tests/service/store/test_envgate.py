"""Closing the LMDB environment at a stop waits for the HTTP handlers inside it, and leaves it open rather than
close it under one (a closed environment's transaction or info() crashes the process); a reader's transaction is
freed before it leaves (a close beside that death crashed the process too)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import lmdb
import pytest
from paths import SCRIPTS

from samplecache_service.store.envgate import EnvClosed, EnvGate


def test_close_waits_for_a_reader_inside_then_lets_no_one_in(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 20)
    gate = EnvGate(env)
    inside, leave = threading.Event(), threading.Event()
    seen: list[int] = []

    def read(txn: lmdb.Transaction) -> None:
        inside.set()
        leave.wait(10)
        seen.append(txn.stat()["entries"])  # still open: the close waited

    def reader() -> None:
        gate.read(read)

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
        gate.read(lambda txn: (inside.set(), leave.wait(10)))

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


def test_a_read_frees_its_transaction_before_it_leaves_even_when_it_raises(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 20)
    gate = EnvGate(env)
    txns: list[weakref.ref[lmdb.Transaction]] = []

    def fails(txn: lmdb.Transaction) -> None:
        txns.append(weakref.ref(txn))
        raise KeyError("no such record")

    with pytest.raises(KeyError) as raised:
        gate.read(fails)
    assert raised.value.__traceback__ is not None and txns[0]() is None  # the traceback keeps no transaction
    assert gate.read(lambda txn: (txns.append(weakref.ref(txn)), txn.stat()["entries"])[1]) == 0
    assert txns[1]() is None
    assert gate.close(timeout=1)


def test_a_transaction_an_error_still_holds_is_kept_by_the_gate_until_the_close(tmp_path: Path) -> None:
    """A comprehension's frame holds ``txn`` through a closure cell that clearing the traceback's frames does not
    reach; an error chained from another (``__context__``) has frames of its own: the gate keeps what escaped."""
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 20)
    gate = EnvGate(env)
    txns: list[weakref.ref[lmdb.Transaction]] = []

    def in_a_comprehension(txn: lmdb.Transaction) -> None:
        txns.append(weakref.ref(txn))
        [txn.get(k) or {}["missing"] for k in [b"a"]]

    def chained(txn: lmdb.Transaction) -> None:
        txns.append(weakref.ref(txn))

        def inner(t: lmdb.Transaction) -> None:
            raise KeyError("inner")
        try:
            inner(txn)
        except KeyError:
            raise ValueError("outer") from None  # __context__ still holds inner's traceback

    with pytest.raises(KeyError) as first:
        gate.read(in_a_comprehension)
    with pytest.raises(ValueError) as second:
        gate.read(chained)
    assert txns[0]() is not None and gate.kept == [txns[0]()]  # escaped: the gate holds it too
    assert txns[1]() is None  # the chain's frames were cleared
    assert gate.close(timeout=1) and gate.kept == []
    del first, second
    assert txns[0]() is None  # freed after the close, by this thread: nothing to race


def test_readers_that_come_and_go_while_it_closes_never_crash_it(tmp_path: Path) -> None:
    """py-lmdb keeps a finished read transaction's handle until its object dies; that death beside a close aborted
    the handle twice. The stress crashed in each of 5 runs when transactions died after their reader left."""
    proc = subprocess.run([sys.executable, str(SCRIPTS / "gate_stress.py"), str(tmp_path), "200"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "rounds=200" in proc.stdout, (proc.returncode, proc.stderr[-3000:])
