"""(a) The reference: every row group's byte range read with ``s3fs.S3FileSystem.cat_file`` by N reader
processes (one s3fs each, like the samplers), in a random order split round-robin over them.

CPU: the machine's busy time over the pass, and that of exactly the processes involved: the S3 server's tree
and the readers, each reporting its own CPU time over its reads (its start-up, imports and connection excluded,
as the daemon's start-up is excluded from the ingest).

``decode=True``: the readers also decode each row group with pyarrow (one thread, the footer read before the
clock), as a sampler's ``read_unit`` does: what any reader that hands rows on pays to get them from S3 into
Arrow, so the ingest's CPU over it is what the daemon adds (encode, staging, LMDB)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import numpy as np

from ..harness import MB
from .cpu import Snapshot, self_cpu_s, spent

Range = tuple[str, int, int, int]


def _reader(opts: dict[str, Any], tasks: list[Range], decode: bool, ready: Any, go: Any, q: Any) -> None:
    try:
        import s3fs
        fs = s3fs.S3FileSystem(**opts)
        if tasks:  # the connection is set up before the clock starts
            fs.cat_file(tasks[0][0], start=0, end=8)
        footers = {}
        if decode:
            import pyarrow.parquet as pq
            for path in {t[0] for t in tasks}:
                with fs.open(path, "rb") as f:
                    footers[path] = (pq.ParquetFile(f).metadata, fs.size(path))
    except BaseException as e:
        ready.put(f"{type(e).__name__}: {e}")
        return
    ready.put(os.getpid())
    go.wait()
    n = 0
    t0, cpu0 = time.time(), self_cpu_s()
    try:
        for path, start, length, group in tasks:
            if decode:  # as FsspecRemote.read_unit: the known footer, the chunks fetched together, one thread
                md, size = footers[path]
                with fs.open(path, "rb", cache_type="none", size=size) as f:
                    table = pq.ParquetFile(f, metadata=md, pre_buffer=True).read_row_groups([group], use_threads=False)
                n += length if table.num_rows == md.row_group(group).num_rows else 0
            else:
                n += len(fs.cat_file(path, start=start, end=start + length))
    except BaseException as e:
        q.put(f"{type(e).__name__}: {e}")
        return
    q.put((n, t0, time.time(), self_cpu_s() - cpu0))


def raw_pass(opts: dict[str, Any], ranges: list[Range], readers: int, server_pid: int,
             decode: bool = False) -> dict[str, float]:
    """Every range once over ``readers`` processes; wall time from the common start, CPU both ways."""
    ctx = mp.get_context("spawn")
    q, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    order = list(ranges)
    np.random.default_rng(0).shuffle(order)  # the samplers read units in a random order too
    parts = [order[i::readers] for i in range(readers)]
    ps = [ctx.Process(target=_reader, args=(opts, p, decode, ready, go, q)) for p in parts if p]
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
               passes: int, decode: bool = False) -> list[dict[str, float]]:
    """One untimed warm-up pass (the server's page cache, its connections), then ``passes`` timed ones."""
    raw_pass(opts, ranges, readers, server_pid, decode)
    return [raw_pass(opts, ranges, readers, server_pid, decode) for _ in range(passes)]
