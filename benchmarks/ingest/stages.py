"""(c) Where a sampler's time goes, in this process: each unit through the steps of
``samplecache_service.sampling.sampler.run_task`` (footer, read, encode, staging write with its fsyncs timed apart) and
then ingested by a ``Writer`` into a scratch LMDB; read variants on the same units (informational); and a
cProfile of ``run_task`` on one unit. These use the daemon's internals: when they change, the step that no longer
fits reports its error and the rest of the benchmark goes on."""

from __future__ import annotations

import cProfile
import dataclasses
import io
import os
import pstats
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from ..harness import MB

STAGES = ("open_footer", "read_row_group", "encode", "stage_write", "stage_fsync", "lmdb_ingest")


def guarded(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - informational parts: say why, report the rest
        return {"error": f"{type(e).__name__}: {e}"}


def stage_profile(truth: dict[str, Any], s3: Any, scratch: Path, max_units: int) -> dict[str, Any]:
    from samplecache_service.remote.columns import infer_schema
    from samplecache_service.remote.stores import FsspecRemote
    from samplecache_service.sampling.encoder import encode_table
    from samplecache_service.store.catalog import Catalog
    from samplecache_service.store.lmdbmap import open_env
    from samplecache_service.store.staging import write_staged
    from samplecache_service.store.writer import Writer

    os.environ.update(s3.env())  # s3fs (botocore) reads the endpoint and the credentials from here
    remote = FsspecRemote(truth["url"], {})
    units = truth["ranges"][:max_units]
    schema, _ = infer_schema(remote.file_info(units[0][0])[1])
    remote.bytes_read = 0
    (scratch / "staging").mkdir(parents=True, exist_ok=True)
    env, dbs = open_env(scratch / "lmdb", 8 * truth["row_group_bytes"] + (1 << 30))
    writer = Writer(env, dbs, Catalog(env, dbs))
    stages: dict[str, list[float]] = {k: [] for k in STAGES}
    nbytes = 0
    try:
        for k, (path, _start, length, rg) in enumerate(units):
            t0 = time.perf_counter()
            remote.footer(path)  # read once per file, as a sampler does
            t1 = time.perf_counter()
            tables = list(remote.read_unit(path, rg, 1, schema.names, 1 << 40))
            t2 = time.perf_counter()
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            blocks, rpb = encode_table(table, schema)
            t3 = time.perf_counter()
            header = {"key": f"p-{k}", "path": path, "row_group": rg, "unit": k, "cycle": 0,
                      "rows": table.num_rows, "rows_per_block": rpb}
            staged = _write_staged_timed(write_staged, scratch / "staging", header, blocks, stages)
            t4 = time.perf_counter()
            writer.ingest(staged).result()
            stages["lmdb_ingest"].append(time.perf_counter() - t4)
            for name, dt in (("open_footer", t1 - t0), ("read_row_group", t2 - t1), ("encode", t3 - t2)):
                stages[name].append(dt)
            nbytes += length
            del table, tables, blocks
    finally:
        writer.close()
        env.close()
    total = sum(sum(v) for v in stages.values())
    return {"units": len(units), "bytes": nbytes, "remote_bytes": remote.bytes_read, "total_s": total,
            "mb_per_s_one_process": nbytes / MB / total,
            "stages": {k: {"seconds": sum(v), "share": sum(v) / total,
                           "mb_per_s": nbytes / MB / sum(v) if sum(v) else None} for k, v in stages.items()}}


def _write_staged_timed(write_staged: Callable[..., Path], directory: Path, header: dict[str, Any],
                        blocks: list[bytes], stages: dict[str, list[float]]) -> Path:
    """write_staged, timed: the whole call, and its fsyncs (if it still makes any) by wrapping os.fsync."""
    real, fsynced = os.fsync, [0.0]

    def timed_fsync(fd: int) -> None:
        t = time.perf_counter()
        real(fd)
        fsynced[0] += time.perf_counter() - t

    os.fsync = timed_fsync  # type: ignore[assignment]
    try:
        t = time.perf_counter()
        path = write_staged(directory, header["key"], header, blocks)
        whole = time.perf_counter() - t
    finally:
        os.fsync = real  # type: ignore[assignment]
    stages["stage_write"].append(whole - fsynced[0])
    stages["stage_fsync"].append(fsynced[0])
    return path


def read_variants(truth: dict[str, Any], s3: Any, max_units: int) -> dict[str, Any]:
    """The read step alone, the same units read several ways in this process: what it could cost."""
    from pyarrow import fs as pafs

    from samplecache_service.remote.stores import FsspecRemote

    os.environ.update(s3.env())
    remote = FsspecRemote(truth["url"], {})
    fs, units = remote.fs, truth["ranges"][:max_units]
    nbytes = sum(u[2] for u in units)
    footers = {path: remote.footer(path) for path in sorted({u[0] for u in units})}
    scheme, host = s3.endpoint.split("://", 1)
    native = pafs.S3FileSystem(access_key=s3.key, secret_key=s3.secret, endpoint_override=host, scheme=scheme,
                               region="us-east-1")

    def raw_only() -> None:
        for path, start, length, _rg in units:
            fs.cat_file(path, start=start, end=start + length)

    def current() -> None:
        for path, _s, _n, rg in units:
            list(remote.read_unit(path, rg, 1, ["x", "y"], 1 << 40))

    def arrow_native() -> None:  # pyarrow's C++ S3 client: ranged reads, no GIL
        for path, _s, _n, rg in units:
            with native.open_input_file(path) as f:
                pq.ParquetFile(f, metadata=footers[path]).read_row_group(rg, columns=["x", "y"])

    rows = []
    for name, fn in (("raw cat_file (no parse)", raw_only), ("FsspecRemote.read_unit (now)", current),
                     ("pyarrow.fs.S3FileSystem, footer known", arrow_native)):
        fn()  # warm-up (connections, server page cache)
        best = min(_timed(fn) for _ in range(2))
        rows.append({"variant": name, "seconds": best, "mb_per_s": nbytes / MB / best})
    return {"units": len(units), "bytes": nbytes, "rows": rows}


def _timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def cprofile_unit(truth: dict[str, Any], s3: Any, scratch: Path, top: int = 14) -> str:
    from samplecache_service.remote.columns import infer_schema
    from samplecache_service.remote.stores import FsspecRemote
    from samplecache_service.sampling.sampler import SampleTask, run_task

    os.environ.update(s3.env())
    path, _s, _n, rg = truth["ranges"][0]
    schema, _ = infer_schema(FsspecRemote(truth["url"], {}).file_info(path)[1])
    staging = scratch / "cprofile"
    staging.mkdir(parents=True, exist_ok=True)
    task = SampleTask(key="cprof", source=truth["url"], storage_options={}, path=path, row_group=rg,
                      schema=schema.to_json(), staging_dir=str(staging), block_bytes=1 << 20)
    run_task(task)  # warm: imports, the s3fs instance, the footer
    prof = cProfile.Profile()
    prof.enable()
    r = run_task(dataclasses.replace(task, key="cprof2"))
    prof.disable()
    if not r.ok:
        return f"run_task failed: {r.error}"
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()
