"""Worker -> trainer transfer of whole batches through a reused shared-memory ring.

DataLoader hands each worker's tensors to the trainer through a *new*
shared-memory segment per tensor: allocating, zero-filling and mapping it costs
more than the copy itself for large batches (about 1.2 GB/s here). The ring is
one anonymous shared mapping made by the trainer process before the workers
fork (so nothing is ever left in /dev/shm, even after kill -9), cut into
``depth`` slots per worker. A worker gathers a batch's fixed-shape columns --
or a pack of several small batches, sent as one item -- straight into a free
slot of its own and sends only a small descriptor. The
trainer hands the batch out as tensors that *view* the slot (no copy at all),
and the slot is free again once every tensor of that batch has been dropped;
with ``pin_memory=True`` on CUDA the batch is copied into pinned memory instead
and the slot freed at once. A worker that finds all its slots still held (the
trainer keeps many batches alive) or a batch that does not fit goes the
ordinary way, so keeping batches is always safe.
"""

from __future__ import annotations

import itertools
import mmap
import os
import weakref
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import default_convert

ALIGN = 64
_RINGS: dict[int, "Ring"] = {}
_ids = itertools.count(1)


class Ring:
    """``workers`` x ``depth`` slots of ``slot_bytes`` in one MAP_SHARED anonymous mapping."""

    def __init__(self, workers: int, depth: int, slot_bytes: int, pack: int = 1) -> None:
        """``pack``: batches a worker gathers into one slot and sends as one item."""
        self.id = next(_ids) + (os.getpid() << 20)
        self.workers, self.depth, self.pack = workers, depth, max(1, int(pack))
        self.slot_bytes = (slot_bytes + ALIGN - 1) // ALIGN * ALIGN
        slots = workers * depth
        self.header = (slots + ALIGN - 1) // ALIGN * ALIGN
        self.mm = mmap.mmap(-1, self.header + slots * self.slot_bytes)  # MAP_SHARED | MAP_ANONYMOUS
        self.flags = np.frombuffer(self.mm, np.uint8, slots, 0)
        self.flags[:] = 0
        # touch every page once here so neither side takes first-write faults in the loop
        np.frombuffer(self.mm, np.uint8)[::4096] = 0
        self.owner = os.getpid()
        self.address = np.frombuffer(self.mm, np.uint8, 1).ctypes.data
        _RINGS[self.id] = self

    def acquire(self, worker: int) -> int | None:
        """A free slot of ``worker`` (called in that worker), or None."""
        base = worker * self.depth
        for s in range(base, base + self.depth):
            if self.flags[s] == 0:
                self.flags[s] = 1
                return s
        return None

    def release(self, slot: int) -> None:
        self.flags[slot] = 0

    def array(self, slot: int, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(self.mm, dtype, count, self.header + slot * self.slot_bytes + offset).reshape(shape)

    def held_array(self, hold: "SlotHold", offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """An array over part of ``hold``'s slot that keeps ``hold`` (so the slot) alive."""
        addr = self.address + self.header + hold.slot * self.slot_bytes + offset
        return np.asarray(_Region(hold, addr, np.dtype(dtype).str, tuple(shape)))


def _release_in(owner: int, ring: Ring, slot: int) -> None:
    """Free ``slot``, but only in the process that made the ring (the trainer): a forked worker that
    inherited a hold, or a descriptor, must never free a slot the trainer may have lent out again."""
    if os.getpid() == owner:
        ring.release(slot)


class SlotHold:
    """One slot lent to the trainer's tensors: freed when the last array over it is gone."""

    def __init__(self, ring: Ring, slot: int) -> None:
        self.slot = slot
        weakref.finalize(self, _release_in, ring.owner, ring, slot)


class _Region:
    """``__array_interface__`` of a piece of a held slot; the array made from it references it."""

    def __init__(self, hold: SlotHold, addr: int, typestr: str, shape: tuple[int, ...]) -> None:
        self.hold = hold
        self.__array_interface__ = {"version": 3, "data": (addr, False), "typestr": typestr, "shape": shape}


class SlotWriter:
    """Hands out arrays inside one slot, for a worker to gather a batch into."""

    def __init__(self, ring: Ring, slot: int) -> None:
        self.ring, self.slot, self.used = ring, slot, 0
        self.fields: dict[str, tuple[int, str, tuple[int, ...]]] = {}

    def alloc(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        off = (self.used + ALIGN - 1) // ALIGN * ALIGN
        if off + nbytes > self.ring.slot_bytes:
            return None
        self.used = off + nbytes
        self.fields[name] = (off, dtype.str, tuple(shape))
        return self.ring.array(self.slot, off, dtype, shape)


class Packed(list):  # type: ignore[type-arg]
    """Several batches that travel as one DataLoader item; ``SampleCacheLoader`` hands them out one by one."""


def split(batch: dict[str, Any], size: int | None) -> Any:
    """``batch`` cut into batches of ``size`` rows (views): a ``Packed`` when there are several."""
    n = next((len(v) for v in batch.values() if hasattr(v, "__len__")), 0)
    if not size or n <= size:
        return batch
    return Packed({k: v[a:a + size] for k, v in batch.items()} for a in range(0, n, size))


class RingBatch:
    """What a worker sends instead of a batch: where its tensors lie in the ring, plus the rest
    (``size``: the batch size, when the slot holds a pack of batches)."""

    def __init__(self, ring_id: int, slot: int, fields: dict[str, tuple[int, str, tuple[int, ...]]],
                 other: dict[str, Any], size: int | None = None) -> None:
        self.ring_id, self.slot, self.fields, self.other, self.size = ring_id, slot, fields, other, size
        self._pending = False  # True in the trainer until materialized: a dropped one frees its slot

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_pending"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        ring = _RINGS.get(self.ring_id)
        self._pending = ring is not None and ring.owner == os.getpid()

    def __del__(self) -> None:
        # DataLoader drops items it no longer wants (an early break, workers shut down): free their slots
        if getattr(self, "_pending", False):
            self._pending = False
            _RINGS[self.ring_id].release(self.slot)

    def materialize(self, pin: bool = False) -> Any:
        """The batch (or ``Packed`` batches) as tensors: views of the slot (freed with the last of them),
        or with ``pin`` copies in pinned memory (the slot freed at once)."""
        ring = _RINGS[self.ring_id]
        self._pending = False
        out: dict[str, Any] = {}
        if not pin:
            hold = SlotHold(ring, self.slot)
            for name, (off, dt, shape) in self.fields.items():
                out[name] = torch.from_numpy(ring.held_array(hold, off, np.dtype(dt), shape))
            out.update(self.other)
            return split(out, self.size)
        try:
            for name, (off, dt, shape) in self.fields.items():
                src = ring.array(self.slot, off, np.dtype(dt), shape)
                t = torch.empty(shape, dtype=torch.from_numpy(src[:0]).dtype, pin_memory=True)
                np.copyto(t.numpy(), src)
                out[name] = t
        finally:
            ring.release(self.slot)
        out.update(self.other)
        return split(out, self.size)

    def pin_memory(self, device: Any = None) -> Any:
        """Called by DataLoader's pin-memory thread: copy straight into pinned memory."""
        return self.materialize(pin=torch.cuda.is_available())


def ring_batch(ring: Ring, worker: int, produce: Callable[[Callable[..., np.ndarray | None] | None], dict[str, Any]],
               size: int | None = None) -> Any:
    """Run ``produce(alloc)`` so that it gathers into a ring slot; falls back to plain tensors. ``size``: the
    batch size, when ``produce`` gathers a pack of several batches."""
    slot = ring.acquire(worker)
    if slot is None:
        return split(produce(None), size)
    writer = SlotWriter(ring, slot)
    try:
        batch = produce(writer.alloc)
    except BaseException:
        ring.release(slot)
        raise
    if not writer.fields:
        ring.release(slot)
        return split(batch, size)
    # what DataLoader does to any batch a worker yields: numpy arrays inside lists become tensors
    other = default_convert({k: v for k, v in batch.items() if k not in writer.fields})
    return RingBatch(ring.id, slot, writer.fields, other, size)


def materialize(item: Any, pin: bool = False) -> Any:
    """A worker's item as the trainer gets it: a batch, or ``Packed`` batches."""
    return item.materialize(pin) if isinstance(item, RingBatch) else item
