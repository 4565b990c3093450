"""What block checksums (record format v3, xxh3_64) cost: hashing, ingest, and the client's read path.

    python -m benchmarks.checksums [--ingest-mb 512] [--small N] [--large N] [--passes 3]
                                   [--json out.json] [--quick] [--workdir DIR]

a. hash: ``record.block_checksum`` over 1 MiB and 64 KiB blocks in memory (MB/s).
b. ingest: shards of ~64 MB (1 MiB blocks, random bytes) staged with ``write_staged`` and ingested by the
   real ``Writer`` into a fresh LMDB (one transaction per shard, like the daemon). Reported: ingest MB/s
   (verification included, as it always runs), the time ``verify_block`` takes over the same staged
   blocks alone, and its share of the ingest time.
c. read: the client's gather path (``CacheReader.batch``, what ``SampleCacheDataset`` calls), over a cache
   built directly with the Writer: SMALL = N samples of 256 uint8 + int64, LARGE = N samples of 1 MiB
   float32 + int64. Positions are shuffled over the whole cache and read in the client's chunks
   (CHUNK_BYTES per read transaction, at most 4096 positions). Three rows per dataset, each one untimed
   warm-up pass then ``--passes`` timed passes (median): ``off`` (verify=False, the default), ``first``
   (verify=True with this process's record of checked blocks cleared before every pass: each block of
   the cache is hashed once per pass, the cost of a fresh process) and ``steady`` (verify=True, blocks
   checked in an earlier pass are not hashed again: what a long-running reader pays). Every pass is
   checked: sample count and sum of ``y`` equal the truth.

MB = 10**6 bytes (the payload of ``x`` for read rows). Caches live under ``--workdir`` (default
./bench-data/checksums, git-ignored) and are rebuilt every run. Exit code 1 when a pass was wrong.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import xxhash

import samplecache.reading.blocks.reader as reader_mod
from samplecache.format.record import Schema, block_checksum, verify_block
from samplecache.reading.blocks.reader import CacheReader
from samplecache.reading.epoch_source import CHUNK_BYTES
from samplecache_service.remote.columns import infer_schema
from samplecache_service.sampling.encoder import encode_table
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.lmdbmap import open_env
from samplecache_service.store.staging import read_staged, write_staged
from samplecache_service.store.writer import Writer

from .harness import MB, cli, report
from .harness.cli import log

SHARD_BYTES = 64 << 20


def timed(fn: Callable[[], Any], passes: int) -> tuple[float, Any]:
    """Median seconds of ``passes`` timed calls after one warm-up, and the last result."""
    got = fn()
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), got


# --- a. hashing ------------------------------------------------------------------------------------

def bench_hash(passes: int) -> dict[str, Any]:
    out: dict[str, Any] = {"xxhash": xxhash.VERSION, "xxh3_impl": xxhash.XXHASH_VERSION}
    for label, size in (("1MiB", 1 << 20), ("64KiB", 64 << 10)):
        blocks = [os.urandom(size) for _ in range(max(1, (64 << 20) // size))]
        dt, _ = timed(lambda: [block_checksum(b) for b in blocks], passes)
        out[f"block_checksum_{label}_mb_per_s"] = len(blocks) * size / dt / MB
    return out


# --- b. ingest ---------------------------------------------------------------------------------------

def _random_table(rows: int, width: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.random(rows * width, dtype=np.float32)
    return pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x), width),
                     "y": pa.array(np.arange(rows, dtype=np.int64) + seed * rows)})


def _open(root: Path, map_size: int) -> tuple[Any, Catalog, Writer]:
    env, dbs = open_env(root / "lmdb", map_size)
    catalog = Catalog(env, dbs)
    return env, catalog, Writer(env, dbs, catalog)


def _stage(staging: Path, name: str, t: pa.Table, schema: Schema, unit: int) -> Path:
    blocks, rpb = encode_table(t, schema, 1 << 20)
    header = {"key": name, "path": f"file:///bench/{name}", "row_group": 0, "unit": unit, "cycle": 0,
              "rows": t.num_rows, "rows_per_block": rpb}
    return write_staged(staging, name, header, blocks)


def bench_ingest(root: Path, total_mb: int) -> dict[str, Any]:
    staging = root / "staging"
    staging.mkdir(parents=True)
    rows = SHARD_BYTES // (1 << 20)  # 1 MiB samples: one per block
    shards = max(1, total_mb * 1_000_000 // SHARD_BYTES)
    schema = infer_schema(_random_table(1, 262_144, 0).schema)[0]
    paths = [_stage(staging, f"u{i}", _random_table(rows, 262_144, i), schema, i) for i in range(shards)]
    nbytes = sum(p.stat().st_size for p in paths)
    t0 = time.perf_counter()  # verification alone, over the same staged (page-cached) files
    for p in paths:
        st = read_staged(p)
        try:
            assert all(verify_block(b) is None for b in st.blocks)
        finally:
            st.close()
    verify_s = time.perf_counter() - t0
    env, catalog, writer = _open(root, 4 * nbytes + (1 << 30))
    try:
        t0 = time.perf_counter()
        for p in paths:
            assert writer.ingest(p).result().shard is not None
        ingest_s = time.perf_counter() - t0
    finally:
        writer.close()
        env.close()
    return {"shards": shards, "bytes": nbytes, "ingest_s": ingest_s, "ingest_mb_per_s": nbytes / ingest_s / MB,
            "verify_s": verify_s, "verify_mb_per_s": nbytes / verify_s / MB, "verify_share": verify_s / ingest_s}


# --- c. read ------------------------------------------------------------------------------------------

def build_read_cache(root: Path, samples: int, width: int, dtype: str) -> tuple[Path, Schema, np.ndarray, int]:
    """A cache of ``samples`` rows; returns (lmdb dir, schema, (n, 3) positions [shard, rpb, row], sum of y)."""
    item = pa.from_numpy_dtype(np.dtype(dtype))
    rng = np.random.default_rng(7)
    staging = root / "staging"
    staging.mkdir(parents=True)
    per_shard = max(1, SHARD_BYTES // (width * np.dtype(dtype).itemsize + 8))
    env, catalog, writer = _open(root, 8 * samples * (width * np.dtype(dtype).itemsize + 64) + (1 << 30))
    positions, ysum, schema = [], 0, None
    try:
        for k, start in enumerate(range(0, samples, per_shard)):
            n = min(per_shard, samples - start)
            if dtype == "uint8":
                x = rng.integers(0, 256, n * width, dtype=np.uint8)
            else:
                x = rng.random(n * width, np.float32)
            y = rng.integers(0, 1 << 31, n, dtype=np.int64)
            t = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x, type=item), width), "y": pa.array(y)})
            schema = schema or infer_schema(t.schema)[0]
            shard = writer.ingest(_stage(staging, f"r{k}", t, schema, k)).result().shard
            positions.append(np.stack([np.full(n, shard.id), np.full(n, shard.rows_per_block), np.arange(n)], 1))
            ysum += int(y.sum())
    finally:
        writer.close()
        env.close()
    assert schema is not None
    return root / "lmdb", schema, np.concatenate(positions).astype(np.int64), ysum


def read_pass(reader: CacheReader, pos: np.ndarray, chunk: int) -> tuple[int, int]:
    n = ysum = 0
    for a in range(0, len(pos), chunk):
        p = pos[a:a + chunk]
        got = reader.batch(p[:, 0], p[:, 1], p[:, 2], [0, 1])
        n += len(got["y"])
        ysum += int(got["y"].sum())
    return n, ysum


def bench_read(root: Path, name: str, samples: int, width: int, dtype: str, passes: int) -> list[dict[str, Any]]:
    lmdb_dir, schema, pos, ysum = build_read_cache(root, samples, width, dtype)
    pos = pos[np.random.default_rng(1).permutation(len(pos))]
    payload = width * np.dtype(dtype).itemsize
    chunk = int(min(4096, max(1, CHUNK_BYTES // (payload + 8))))
    rows = []
    for mode in ("off", "first", "steady"):
        reader = CacheReader(str(lmdb_dir), 1 << 40, schema, verify=mode != "off")

        def one() -> tuple[int, int]:
            if mode == "first":
                reader_mod._VERIFIED.get(str(lmdb_dir), set()).clear()
            return read_pass(reader, pos, chunk)

        dt, got = timed(one, passes)
        ok = got == (samples, ysum)
        rows.append({"dataset": name, "verify": mode, "samples": samples, "payload_bytes": payload,
                     "median_s": dt, "samples_per_s": samples / dt, "mb_per_s": samples * payload / dt / MB,
                     "verified": ok})
        log(f"  read {name:<5} verify={mode:<6} {samples / dt:>12,.0f} samples/s {samples * payload / dt / MB:>9,.1f} "
            f"MB/s {'ok' if ok else 'WRONG'}")
    off = rows[0]["samples_per_s"]
    for r in rows:
        r["ratio_to_off"] = r["samples_per_s"] / off
    return rows


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    cli.common(p, workdir=cli.BENCH_DATA / "checksums")
    p.add_argument("--ingest-mb", type=int, default=None, help="MB staged and ingested (default 512; --quick 64)")
    p.add_argument("--small", type=int, default=None, help="SMALL samples (default 400000; --quick 20000)")
    p.add_argument("--large", type=int, default=None, help="LARGE samples (default 512; --quick 32)")
    p.add_argument("--passes", type=int, default=None, help="timed passes (default 3; --quick 1)")
    a = p.parse_args(argv)
    q = a.quick
    ingest_mb = a.ingest_mb or (64 if q else 512)
    small, large = a.small or (20_000 if q else 400_000), a.large or (32 if q else 512)
    passes = a.passes or (1 if q else 3)
    load_start = report.loadavg()
    if a.workdir.exists():
        shutil.rmtree(a.workdir)
    a.workdir.mkdir(parents=True)
    try:
        log("hash")
        hashing = bench_hash(passes)
        log(f"  block_checksum: {hashing['block_checksum_1MiB_mb_per_s']:,.0f} MB/s (1 MiB blocks), "
            f"{hashing['block_checksum_64KiB_mb_per_s']:,.0f} MB/s (64 KiB)")
        log(f"ingest ({ingest_mb} MB)")
        ingest = bench_ingest(a.workdir / "ingest", ingest_mb)
        log(f"  ingest {ingest['ingest_mb_per_s']:,.0f} MB/s with verification; verification alone "
            f"{ingest['verify_mb_per_s']:,.0f} MB/s = {100 * ingest['verify_share']:.1f}% of the ingest time")
        shutil.rmtree(a.workdir / "ingest")
        log("read (CacheReader.batch, shuffled positions)")
        rows = bench_read(a.workdir / "small", "small", small, 256, "uint8", passes)
        rows += bench_read(a.workdir / "large", "large", large, 262_144, "float32", passes)
    finally:
        shutil.rmtree(a.workdir, ignore_errors=True)
    print(f"\n{'dataset':<8}{'verify':<8}{'samples/s':>14}{'MB/s':>10}{'x off':>8}")
    for r in rows:
        print(f"{r['dataset']:<8}{r['verify']:<8}{r['samples_per_s']:>14,.0f}{r['mb_per_s']:>10,.1f}"
              f"{r['ratio_to_off']:>8.2f}")
    print(f"\nhash: {hashing['block_checksum_1MiB_mb_per_s']:,.0f} MB/s; "
          f"ingest: {ingest['ingest_mb_per_s']:,.0f} MB/s, "
          f"verification {100 * ingest['verify_share']:.1f}% of it ({ingest['verify_mb_per_s']:,.0f} MB/s); "
          f"median of {passes} pass(es)")
    report.write_report(a.json, {"benchmark": "checksums", "passes": passes, "hash": hashing, "ingest": ingest,
                                 "read": rows, "host": report.host(load_start, ("numpy", "pyarrow", "xxhash"))})
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
