"""Copying a batch's samples into place on more than one core.

Gathering large samples is bound by memory bandwidth, and one core cannot use
all of it: on the 2-core benchmark machine one thread copies about 8 GB/s and
two about 16 GB/s. numpy releases the GIL while it copies, so a batch's copies
are split over the calling thread and a small per-process thread pool. Small
batches are copied by the caller alone (handing work to a thread costs ~50 us).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

PARALLEL_MIN_BYTES = 2 << 20  # a batch smaller than this is copied by the calling thread alone
MAX_THREADS = 4
_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked child makes its own


def default_threads() -> int:
    """Copy threads for in-process reading: the cores this process may run on, at most ``MAX_THREADS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    pid = os.getpid()
    if _POOL is None or _POOL[0] != pid:  # never use a pool inherited across fork: its threads are gone
        _POOL = (pid, ThreadPoolExecutor(MAX_THREADS - 1, thread_name_prefix="samplecache-gather"))
    return _POOL[1]


def _run(jobs: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    for dst, src in jobs:
        np.copyto(dst, src)


def split(work: Callable[[int, int], None], n: int, nbytes: int, threads: int = 1) -> None:
    """``work(a, b)`` over [0, n) in up to ``threads`` parts run at once, when ``nbytes`` make it worth it."""
    threads = min(threads, n, MAX_THREADS)
    if threads <= 1 or nbytes < PARALLEL_MIN_BYTES:
        work(0, n)
        return
    cuts = [n * k // threads for k in range(threads + 1)]
    parts = [(cuts[k], cuts[k + 1]) for k in range(1, threads)]
    futures = [_pool().submit(work, a, b) for a, b in parts]
    try:
        work(cuts[0], cuts[1])
    finally:
        for f, (a, b) in zip(futures, parts):  # a part no thread has started yet is done here: no waiting for a core
            if f.cancel():
                work(a, b)
            else:
                f.result()  # waits for every part (and raises its error) before the batch is handed out


def copy_all(jobs: Sequence[tuple[np.ndarray, np.ndarray]], threads: int = 1) -> None:
    """``np.copyto(dst, src)`` for every pair, split over up to ``threads`` threads when worth it."""
    split(lambda a, b: _run(jobs[a:b]), len(jobs), sum(d.nbytes for d, _ in jobs), threads)
