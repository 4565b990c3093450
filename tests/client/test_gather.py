"""``gather.copy_all``: a batch's copies split over threads land exactly where a serial copy puts them."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from samplecache.reading.blocks import gather, reader


def jobs(n: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 2**31, size=(n * 2, width), dtype=np.int32)
    order = rng.permutation(n * 2)[:n]
    out = np.zeros((n, width), np.int32)
    return out, src[order], [(out[j], src[i]) for j, i in enumerate(order.tolist())]


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 9])
def test_parallel_copies_equal_a_serial_gather(threads: int) -> None:
    out, want, pairs = jobs(13, 1 << 16, threads)  # 13 x 256 KiB: above PARALLEL_MIN_BYTES
    assert out.nbytes >= gather.PARALLEL_MIN_BYTES
    gather.copy_all(pairs, threads)
    assert np.array_equal(out, want)


def test_small_batches_are_copied_by_the_caller_alone() -> None:
    out, want, pairs = jobs(4, 16, 0)
    gather._POOL = None
    gather.copy_all(pairs, 4)
    assert np.array_equal(out, want)
    assert gather._POOL is None  # no pool was even made


def test_an_error_in_any_part_reaches_the_caller_after_every_part_finished() -> None:
    out, _, pairs = jobs(8, 1 << 16, 1)
    pairs[-1] = (pairs[-1][0], np.zeros(3, np.int32))  # a shape mismatch in the last thread's part
    with pytest.raises(ValueError):
        gather.copy_all(pairs, 2)
    assert out[:4].any()  # the other part still ran


def test_a_forked_child_makes_its_own_pool() -> None:
    out, want, pairs = jobs(8, 1 << 16, 2)
    gather.copy_all(pairs, 2)  # the parent's pool exists now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            o2, want2, pairs2 = jobs(8, 1 << 16, 3)
            gather.copy_all(pairs2, 2)
            os.write(w, b"1" if np.array_equal(o2, want2) and gather._POOL[0] == os.getpid() else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    assert np.array_equal(out, want)


def test_default_threads_is_the_usable_cores_capped() -> None:
    assert 1 <= gather.default_threads() <= min(gather.MAX_THREADS, len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("dtype,shape", [(np.uint8, (256,)), (np.int64, ()), (np.float32, (3, 5)), (np.bool_, (7,))])
def test_one_gather_over_the_mapped_blocks_equals_a_gather_block_by_block(dtype: Any, shape: tuple[int, ...]) -> None:
    """``reader._gather_mapped`` reaches every block through one array over the memory they lie in (unaligned,
    with gaps between them, as LMDB values are), and lands each row where the block-by-block gather puts it."""
    rng = np.random.default_rng(len(shape))
    row = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    sizes = [5, 300, 1, 64, 17]
    raw = rng.integers(0, 256, size=sum(sizes) * row + 11 * len(sizes), dtype=np.uint8)
    srcs, at = [], 3  # each block starts at an odd offset, after a gap
    for n in sizes:
        srcs.append(raw[at:at + n * row].view(dtype).reshape((n,) + shape))
        at += n * row + 7
    inverse = rng.integers(0, len(sizes), 500)
    local = np.array([rng.integers(0, sizes[u]) for u in inverse.tolist()], np.int64)
    where = reader._Where(list(range(len(sizes))), inverse, local)
    out = np.zeros((500,) + shape, dtype)
    assert reader._gather_mapped(srcs, out, where)
    want = np.stack([srcs[u][r] for u, r in zip(inverse.tolist(), local.tolist())])
    assert out.tobytes() == want.tobytes()  # bytes: random float bits hold NaNs
    out[:] = 0  # split over threads (any batch counts as large here): the same bytes
    with pytest.MonkeyPatch.context() as m:
        m.setattr(gather, "PARALLEL_MIN_BYTES", 0)
        assert reader._gather_mapped(srcs, out, where, threads=3)
    assert out.tobytes() == want.tobytes()
    for piece in (1, row, 7 * row, 64 * row + 1):  # in pieces (numpy's temporary kept small), odd ones, a row each
        out[:] = 0
        with pytest.MonkeyPatch.context() as m:
            m.setattr(gather, "PARALLEL_MIN_BYTES", 0)
            m.setattr(reader, "PIECE_BYTES", piece)
            assert reader._gather_mapped(srcs, out, where, threads=3)
        assert out.tobytes() == want.tobytes()
    # a block that is not one contiguous array (a broadcast mask) is left to the loop: nothing written
    strided = [np.broadcast_to(s[:1], s.shape) for s in srcs]
    out[:] = 0
    assert not reader._gather_mapped(strided, out, where) and not out.any()
