"""The shared-memory ring's slot lifetime: batches handed out as views of a slot keep it until the last of
their tensors is gone, and only then may a worker reuse it."""

from __future__ import annotations

import gc
import os

import numpy as np
import torch

from samplecache.pytorch.transport import Ring, RingBatch, SlotWriter, materialize, ring_batch


def filled(ring: Ring, worker: int, value: float) -> RingBatch:
    def produce(alloc: object) -> dict[str, object]:
        assert alloc is not None
        x = alloc("x", (4, 1024), np.dtype("<f4"))
        y = alloc("y", (4,), np.dtype("<i8"))
        x[:] = value
        y[:] = np.arange(4) + int(value)
        return {"x": torch.from_numpy(x), "y": torch.from_numpy(y), "name": f"b{value}"}

    got = ring_batch(ring, worker, produce)
    assert isinstance(got, RingBatch)
    return got


def in_ring(ring: Ring, t: torch.Tensor) -> bool:
    return ring.address <= t.data_ptr() < ring.address + len(ring.mm)


def test_a_batch_views_its_slot_and_frees_it_with_its_last_tensor() -> None:
    ring = Ring(workers=1, depth=2, slot_bytes=64 << 10)
    rb = filled(ring, 0, 3.0)
    slot = rb.slot
    batch = materialize(rb)
    assert in_ring(ring, batch["x"]) and in_ring(ring, batch["y"])  # no copy was made
    assert batch["name"] == "b3.0" and float(batch["x"].sum()) == 3.0 * 4 * 1024
    assert batch["y"].tolist() == [3, 4, 5, 6]
    assert ring.flags[slot] == 1
    x = batch["x"][1:3]  # a view of a view keeps the slot too
    del batch, rb
    gc.collect()
    assert ring.flags[slot] == 1
    assert float(x.sum()) == 3.0 * 2 * 1024
    del x
    assert ring.flags[slot] == 0  # freed by reference counting, no gc needed


def test_held_slots_make_the_worker_fall_back_and_kept_batches_stay_intact() -> None:
    ring = Ring(workers=1, depth=2, slot_bytes=64 << 10)
    kept = [materialize(filled(ring, 0, v)) for v in (1.0, 2.0)]
    assert sorted(ring.flags.tolist()) == [1, 1]
    produced: list[bool] = []

    def produce(alloc: object) -> dict[str, object]:
        produced.append(alloc is None)
        return {"x": torch.full((4, 1024), 9.0)}

    plain = ring_batch(ring, 0, produce)  # no free slot: the ordinary way
    assert produced == [True] and isinstance(plain, dict)
    assert [float(b["x"].mean()) for b in kept] == [1.0, 2.0]
    kept.pop(0)
    again = materialize(filled(ring, 0, 5.0))  # the freed slot is reused; the kept batch is untouched
    assert float(again["x"].mean()) == 5.0 and float(kept[0]["x"].mean()) == 2.0


def test_a_forked_worker_writes_a_slot_the_parent_reads_without_a_copy() -> None:
    ring = Ring(workers=1, depth=2, slot_bytes=64 << 10)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: gather into a slot, send its descriptor's slot number
        try:
            writer = SlotWriter(ring, ring.acquire(0) or 0)
            a = writer.alloc("x", (16,), np.dtype("<i8"))
            assert a is not None
            a[:] = np.arange(16) * 7
            os.write(w, bytes([writer.slot]))
        finally:
            os._exit(0)
    os.close(w)
    slot = os.read(r, 1)[0]
    os.waitpid(pid, 0)
    batch = materialize(RingBatch(ring.id, slot, {"x": (0, "<i8", (16,))}, {}))
    assert in_ring(ring, batch["x"]) and batch["x"].tolist() == [i * 7 for i in range(16)]
    assert ring.flags[slot] == 1
    del batch
    assert ring.flags[slot] == 0


def test_a_descriptor_the_trainer_drops_unread_frees_its_slot() -> None:
    """DataLoader discards items after an early break or at shutdown: their slots must come back."""
    import pickle

    ring = Ring(workers=1, depth=2, slot_bytes=64 << 10)
    sent = pickle.dumps(filled(ring, 0, 4.0))  # what a worker puts on the queue
    got = pickle.loads(sent)  # what the trainer receives
    slot = got.slot
    assert ring.flags[slot] == 1
    del got
    assert ring.flags[slot] == 0
    again = pickle.loads(pickle.dumps(filled(ring, 0, 6.0)))
    s2 = again.slot
    batch = materialize(again)
    del again  # materialized: the tensors own the slot now, dropping the descriptor frees nothing
    assert ring.flags[s2] == 1 and float(batch["x"].mean()) == 6.0
    del batch
    assert ring.flags[s2] == 0


def test_a_forked_child_dropping_inherited_views_never_frees_the_trainers_slot() -> None:
    ring = Ring(workers=1, depth=2, slot_bytes=64 << 10)
    batch = materialize(filled(ring, 0, 2.0))
    slot = next(s for s in range(2) if ring.flags[s] == 1)
    pid = os.fork()
    if pid == 0:  # a worker forked while the trainer held the batch
        try:
            del batch
            gc.collect()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert ring.flags[slot] == 1  # still lent to the trainer's tensors
    assert float(batch["x"].mean()) == 2.0
    del batch
    assert ring.flags[slot] == 0
