"""Units sized by bytes: a sampler's peak memory on one huge row group, and the ingest rate of a file of
thousands of tiny row groups against pyarrow reading the whole file.

    .venv/bin/python -m benchmarks.parquet_units [--big-mib 1024] [--tiny-groups 10000] [--workdir DIR]
                                                 [--json out.json] [--quick]

A sampler holds about two or three shard targets, plus the largest data page of the file (a reader
holds a page whole). Both run the real sampling task (``service.sampler.run_task``) on a ``file://`` remote, in a fresh
subprocess (its peak RSS is ``ru_maxrss``), with the daemon's unit plan (``planner.plan_units``). The files live
in a temporary directory under ``--workdir`` (default ./bench-data), removed at the end. ``--quick``: a 64 MiB
row group and 500 tiny ones.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from samplecache_service.remote.columns import infer_schema
from samplecache_service.remote.planner import plan_units
from samplecache_service.remote.schemas import to_text
from samplecache_service.sampling.sampler import SampleTask, run_task

from .harness import cli, report

MiB = 1 << 20


def _tasks(path: Path, part_bytes: int, unit_bytes: int, staging: Path) -> list[SampleTask]:
    md = pq.ParquetFile(path).metadata
    schema, _ = infer_schema(md.schema.to_arrow_schema())
    rows = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    sizes = [md.row_group(g).total_byte_size for g in range(md.num_row_groups)]
    return [SampleTask(key=f"u{i}", source=f"file://{path}", storage_options={}, path=str(path), row_group=g,
                       schema=schema.to_json(), staging_dir=str(staging), block_bytes=MiB, unit=i,
                       row_groups=c, part_bytes=part_bytes, arrow_schema=to_text(md.schema.to_arrow_schema()))
            for i, (g, c, _) in enumerate(plan_units(rows, sizes, unit_bytes))]


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(tasks: list[SampleTask], out: Any) -> None:
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts here, not at what the parent held
    t0 = time.perf_counter()
    results = [run_task(t) for t in tasks]
    bad = [r.error for r in results if not r.ok]
    out.put({"seconds": time.perf_counter() - t0, "errors": bad[:3], "rows": sum(r.rows for r in results),
             "shards": sum(len(r.parts) for r in results), "bytes": sum(r.bytes for r in results),
             "peak_rss": _peak_rss()})


def run_in_child(tasks: list[SampleTask]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(tasks, q))
    p.start()
    got = q.get()
    p.join()
    return got  # type: ignore[no-any-return]


def big_row_group(work: Path, mib: int, part_mib: int) -> dict[str, Any]:
    path = work / "big.parquet"
    rows, row_bytes = mib, MiB  # 1 MiB encoded images (binary), as an image dataset holds them
    data = pa.py_buffer(np.random.default_rng(0).bytes(rows * row_bytes))
    offsets = pa.py_buffer((np.arange(rows + 1, dtype=np.int64) * row_bytes).tobytes())
    x = pa.Array.from_buffers(pa.large_binary(), rows, [None, offsets, data])
    # pages of 8 values (8 MiB): pyarrow checks the page size only every write_batch_size values, so by
    # default all 1 MiB values of the row group would be ONE page, which any reader must hold whole
    pq.write_table(pa.table({"id": pa.array(np.arange(rows)), "x": x}), path, row_group_size=rows,
                   compression="none", write_batch_size=8)
    del data, x
    assert pq.ParquetFile(path).metadata.num_row_groups == 1, "not one row group"
    staging = work / "staging-big"
    staging.mkdir()
    got = run_in_child(_tasks(path, part_mib * MiB, part_mib * MiB, staging))
    shutil.rmtree(staging)
    path.unlink()
    return dict(got, row_group_mib=mib, part_mib=part_mib)


def tiny_row_groups(work: Path, groups: int, rows_per_group: int) -> dict[str, Any]:
    path = work / "tiny.parquet"
    n = groups * rows_per_group
    rng = np.random.default_rng(1)
    table = pa.table({"id": pa.array(np.arange(n)), "x": pa.array(rng.random(n, dtype=np.float32)),
                      "label": pa.array(rng.integers(0, 10, n)), "name": pa.array([f"r{i}" for i in range(n)])})
    pq.write_table(table, path, row_group_size=rows_per_group)
    t0 = time.perf_counter()
    whole = pq.read_table(path)
    pyarrow_s = time.perf_counter() - t0
    assert whole.num_rows == n
    staging = work / "staging-tiny"
    staging.mkdir()
    tasks = _tasks(path, 64 * MiB, 64 * MiB, staging)
    got = run_in_child(tasks)
    shutil.rmtree(staging)
    return dict(got, groups=groups, units=len(tasks), pyarrow_seconds=pyarrow_s,
                rate_vs_pyarrow=pyarrow_s / got["seconds"] if got["seconds"] else 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    cli.common(ap, quick="a 64 MiB row group and 500 tiny ones (a smoke run)")
    ap.add_argument("--big-mib", type=int, default=None, help="size of the one large row group (MiB; default 1024)")
    ap.add_argument("--part-mib", type=int, default=64, help="shard target (--unit-bytes) in MiB")
    ap.add_argument("--tiny-groups", type=int, default=None, help="tiny row groups (default 10000)")
    ap.add_argument("--tiny-rows", type=int, default=10, help="rows per tiny row group")
    args = ap.parse_args(argv)
    big_mib = args.big_mib or (64 if args.quick else 1024)
    tiny_groups = args.tiny_groups or (500 if args.quick else 10_000)
    load_start = report.loadavg()
    args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sc-units-", dir=args.workdir))
    try:
        big = big_row_group(work, big_mib, args.part_mib)
        print(f"one {big['row_group_mib']} MiB row group, shard target {big['part_mib']} MiB: {big['shards']} shards, "
              f"{big['rows']} rows in {big['seconds']:.1f} s; sampler peak RSS {big['peak_rss'] / MiB:.0f} MiB "
              f"({big['peak_rss'] / (big['part_mib'] * MiB):.1f}x the shard target); errors: {big['errors']}")
        tiny = tiny_row_groups(work, tiny_groups, args.tiny_rows)
        print(f"{tiny['groups']} row groups of {args.tiny_rows} rows: {tiny['units']} units, {tiny['shards']} shards, "
              f"ingest task {tiny['seconds']:.2f} s vs pyarrow read_table {tiny['pyarrow_seconds']:.2f} s: "
              f"{tiny['rate_vs_pyarrow']:.2f}x pyarrow's rate; errors: {tiny['errors']}")
        result = {"benchmark": "parquet_units", "big": big, "tiny": tiny, "host": report.host(load_start)}
        print(json.dumps({"big": big, "tiny": tiny}))
        print(report.load_note(load_start))
        report.write_report(args.json, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not big["errors"] and not tiny["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
