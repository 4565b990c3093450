"""Reused output buffers for in-process batches: the gathers write into memory the consumer has let go of.

A fresh ``np.empty`` per large batch costs a page fault per 4 KiB page on first write (the allocator hands
large blocks back to the kernel when they are freed), which made in-process reading of 1 MiB samples run at a
third of ``memcpy``'s speed. ``BufferPool.alloc`` (the ``alloc`` hook of ``CacheReader.batch``) hands out
views of a few kept buffers per size instead, 64-byte aligned (TensorFlow adopts such arrays without a copy).

When a buffer is free: every array, tensor or view made from a pool buffer keeps the buffer alive by
reference (numpy views reference the buffer as their ``base``; ``torch.from_numpy`` and TensorFlow's adopted
tensors reference the array they were made from, and so the buffer), so a buffer is free when the pool's list
holds the only reference to it. Its reference count is compared with that of an array only a list holds,
measured the same way at import (no fixed number that a Python version could change). A buffer still held is
never written; when every kept buffer of a size is held, the batch gets a fresh array that the pool does not
keep, so holding any number of batches is safe.

``allocate(nbytes)`` makes the kept buffers: plain numpy by default; the PyTorch adapter passes page-locked
(pinned) memory when CUDA is available, so ``.to("cuda", non_blocking=True)`` copies straight from it. Memory
handed to an asynchronous copy must stay referenced until the copy is done (``SampleCacheLoader(device=)``
does that). No framework is imported here.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Callable

import numpy as np

ALIGN = 64  # bytes: TensorFlow adopts a numpy array without a copy when its data is this aligned
MIN_BYTES = 64 << 10  # smaller outputs come from numpy's allocator as usual
PER_SIZE = 8  # buffers kept per size (the batches in flight: the consumer's, the read-ahead, the one being made)


def _refs(held: list[np.ndarray], i: int) -> int:
    """References to ``held[i]``, counted the same way for the probe below and for the pool's buffers."""
    return sys.getrefcount(held[i])


_FREE = _refs([np.empty(1)], 0)  # what _refs says when only the list holds the array


def plain(nbytes: int) -> np.ndarray:
    """An ordinary numpy buffer of ``nbytes`` bytes."""
    return np.empty(nbytes, np.uint8)


class BufferPool:
    """Aligned output buffers, reused once nothing but the pool refers to them. Thread-safe."""

    def __init__(self, allocate: Callable[[int], np.ndarray] = plain, min_bytes: int = MIN_BYTES,
                 per_size: int = PER_SIZE) -> None:
        """``allocate(nbytes)``: a new 1-D uint8 buffer (e.g. pinned memory viewed as numpy)."""
        self._allocate, self.min_bytes, self.per_size = allocate, int(min_bytes), int(per_size)
        self._held: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        self.made = 0  # buffers allocated (kept or not): a measure of reuse

    def alloc(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """An array of ``shape`` and ``dtype`` in a free kept buffer (or a new one); None below ``min_bytes``
        (the caller allocates as usual). ``name`` (the column) is not used: buffers go by size."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes:
            return None
        with self._lock:
            held = self._held.setdefault(nbytes, [])
            raw = next((held[i] for i in range(len(held)) if _refs(held, i) <= _FREE), None)
            if raw is None:
                raw = self._allocate(nbytes + ALIGN)
                self.made += 1
                if len(held) < self.per_size:
                    held.append(raw)
        off = -raw.ctypes.data % ALIGN
        return raw[off:off + nbytes].view(dtype).reshape(shape)

    def kept(self) -> int:
        """Buffers the pool keeps (all sizes)."""
        with self._lock:
            return sum(len(v) for v in self._held.values())

    def clear(self) -> None:
        """Forget every kept buffer (the arrays still held elsewhere stay valid)."""
        with self._lock:
            self._held.clear()


__all__ = ["ALIGN", "BufferPool", "plain"]
