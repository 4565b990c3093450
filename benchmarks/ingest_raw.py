"""(a) The reference: every row group's byte range read with ``s3fs.S3FileSystem.cat_file`` by N reader
processes (one s3fs each, like the samplers), in a random order split round-robin over them.

CPU: the machine's busy time over the pass, and that of exactly the processes involved: the S3 server's tree
and the readers, each reporting its own CPU time over its reads (its start-up, imports and connection excluded,
as the daemon's start-up is excluded from the ingest)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import numpy as np

from .ingest_cpu import Snapshot, self_cpu_s, spent
from .harness import MB

Range = tuple[str, int, int, int]


def _reader(opts: dict[str, Any], tasks: list[Range], ready: Any, go: Any, q: Any) -> None:
    try:
        import s3fs
        fs = s3fs.S3FileSystem(**opts)
        if tasks:  # the connection is set up before the clock starts
            fs.cat_file(tasks[0][0], start=0, end=8)
    except BaseException as e:
        ready.put(f"{type(e).__name__}: {e}")
        return
    ready.put(os.getpid())
    go.wait()
    n = 0
    t0, cpu0 = time.time(), self_cpu_s()
    try:
        for path, start, length, _ in tasks:
            n += len(fs.cat_file(path, start=start, end=start + length))
    except BaseException as e:
        q.put(f"{type(e).__name__}: {e}")
        return
    q.put((n, t0, time.time(), self_cpu_s() - cpu0))


def raw_pass(opts: dict[str, Any], ranges: list[Range], readers: int, server_pid: int) -> dict[str, float]:
    """Every range once over ``readers`` processes; wall time from the common start, CPU both ways."""
    ctx = mp.get_context("spawn")
    q, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    order = list(ranges)
    np.random.default_rng(0).shuffle(order)  # the samplers read units in a random order too
    parts = [order[i::readers] for i in range(readers)]
    ps = [ctx.Process(target=_reader, args=(opts, p, ready, go, q)) for p in parts if p]
    for p in ps:
        p.start()
    try:
        for _ in ps:
            r = ready.get(timeout=120)
            if isinstance(r, str):
                raise RuntimeError(f"raw reader failed to start: {r}")
        t0, snap0 = time.time(), Snapshot.take(server_pid)
        go.set()
        got = [q.get(timeout=1800) for _ in ps]
        used = spent(snap0, Snapshot.take(server_pid))
        bad = [g for g in got if isinstance(g, str)]
        if bad:
            raise RuntimeError(f"raw reader failed: {bad[0]}")
    finally:
        go.set()
        for p in ps:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    nbytes = sum(g[0] for g in got)
    wall = max(g[2] for g in got) - t0
    want = sum(r[2] for r in ranges)
    if nbytes != want:
        raise RuntimeError(f"raw read got {nbytes} bytes, expected {want}")
    readers_cpu = sum(g[3] for g in got)
    procs = used["server"] + readers_cpu
    mb = nbytes / MB
    return {"readers": len(ps), "seconds": wall, "bytes": nbytes, "mb_per_s": mb / wall,
            "cpu_ms_per_mb": 1000 * used["machine"] / mb, "cores_busy": used["machine"] / wall,
            "proc_cpu_ms_per_mb": 1000 * procs / mb, "proc_cores_busy": procs / wall,
            "server_cpu_s": used["server"], "readers_cpu_s": readers_cpu}


def raw_series(opts: dict[str, Any], ranges: list[Range], readers: int, server_pid: int,
               passes: int) -> list[dict[str, float]]:
    """One untimed warm-up pass (the server's page cache, its connections), then ``passes`` timed ones."""
    raw_pass(opts, ranges, readers, server_pid)
    return [raw_pass(opts, ranges, readers, server_pid) for _ in range(passes)]
