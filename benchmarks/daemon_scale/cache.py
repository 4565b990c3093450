"""A daemon_scale cache built WITHOUT the remote and without a daemon (``benchmarks.daemon_scale``).

The LMDB environment is opened with ``samplecache_service.store.writer.open_env``; a ``Catalog`` and a ``Writer``
in-process take write transactions of many shards each (``CacheSpec.per_txn``): every block encoded with
``samplecache.format.blockenc.encode_block`` under a schema from
``samplecache_service.sampling.encoder.infer_schema``, shard JSON from ``catalog.Shard``, and the meta keys
``format``, ``source``, ``schema``, ``next_shard`` plus a ``files`` entry per source file whose row groups are
exactly the cached shards. The source is a real local Parquet directory of tiny files with the same Arrow schema
(``file://``), so the real daemon starts on the cache, finds every unit of the source resident and samples
nothing. ``y`` of sample i (in shard-id order) is i.
``start_idle`` starts that daemon and times its start-up (to /healthz, /readyz and the sampler idle).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from samplecache.format.blockenc import ColumnData, encode_block
from samplecache.format.record import FORMAT_VERSION, record_key
from samplecache_service.remote.columns import infer_schema
from samplecache_service.remote.stores import FsspecRemote
from samplecache_service.store.cachedir import map_size_for
from samplecache_service.store.catalog import Catalog, Shard, u64
from samplecache_service.store.fileinfo import FileInfo
from samplecache_service.store.lmdbmap import open_env
from samplecache_service.store.writer import Writer
from samplecache_tools.launch import DaemonProcess

from ..harness import human, log, read_json, start_daemon, wait_idle, write_json

BENCH_FORMAT = 1
GiB = 1 << 30
X_POOL = 16  # distinct x payloads (random bytes), reused across blocks: building stays cheap

@dataclass(frozen=True)
class CacheSpec:
    name: str
    shards: int
    rows: int              # samples per shard
    blocks: int            # blocks per shard (rows divisible by blocks)
    width: int             # bytes of x per sample (uint8)
    files: int             # source files; the shards are their row groups, spread evenly
    per_txn: int           # shards per write transaction

    @property
    def rows_per_block(self) -> int:
        return self.rows // self.blocks

    @property
    def samples(self) -> int:
        return self.shards * self.rows

    def params(self) -> dict[str, Any]:
        return {"bench_format": BENCH_FORMAT, "record_format": FORMAT_VERSION, **asdict(self)}

    def y_sum(self) -> int:
        n = self.samples  # y of sample i (in shard-id order) is i
        return n * (n - 1) // 2


def arrow_schema(width: int) -> pa.Schema:
    return pa.schema([("x", pa.list_(pa.uint8(), width)), ("y", pa.int64())])


def write_source(spec: CacheSpec, src: Path) -> tuple[str, list[str]]:
    """``spec.files`` tiny Parquet files with the cache's Arrow schema; (source URL, paths as the daemon lists them)."""
    url = f"file://{src.resolve()}"
    want = [f"part-{i:05d}.parquet" for i in range(spec.files)]
    have = sorted(p.name for p in src.glob("*.parquet")) if src.is_dir() else []
    if have != want:
        if src.exists():
            shutil.rmtree(src)
        src.mkdir(parents=True)
        schema = arrow_schema(spec.width)
        x = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(spec.width, np.uint8)), spec.width)
        t = pa.Table.from_arrays([x, pa.array([0], pa.int64())], schema=schema)
        for name in want:
            pq.write_table(t, src / name)
    paths = FsspecRemote(url).list_files()
    if len(paths) != spec.files:
        raise RuntimeError(f"the source lists {len(paths)} files, expected {spec.files}")
    return url, paths


def cache_max_bytes(data_bytes: int) -> int:
    """The daemon's budget for a built cache: nothing evicted, nothing left out of an epoch (headroom 0.2)."""
    return 2 * data_bytes + GiB


def build_cache(spec: CacheSpec, root: Path) -> dict[str, Any]:
    """The cache of ``spec`` under ``root/cache`` (reused when the parameters match); what it holds."""
    cache, build_path = root / "cache", root / "build.json"
    source, paths = write_source(spec, root / "source")
    got = read_json(build_path)
    if got is not None and got.get("params") == spec.params() and got.get("source") == source \
            and (cache / "lmdb" / "data.mdb").exists():
        log(f"{spec.name}: reusing cache {cache} ({human(got['data_bytes'])})")
        return dict(got, reused=True)
    if cache.exists():
        shutil.rmtree(cache)
    build_path.unlink(missing_ok=True)
    (cache / "staging").mkdir(parents=True)

    schema, skipped = infer_schema(arrow_schema(spec.width))
    rng = np.random.default_rng(7)
    rpb = spec.rows_per_block
    pool = [rng.integers(0, 256, size=(rpb, spec.width), dtype=np.uint8) for _ in range(X_POOL)]
    block_len = len(encode_block(schema, [ColumnData(pool[0]), ColumnData(np.zeros(rpb, np.int64))], rpb))
    shard_bytes = block_len * spec.blocks
    data_bytes = shard_bytes * spec.shards
    free = shutil.disk_usage(root).free
    if data_bytes * 1.3 + GiB > free:
        raise RuntimeError(f"{spec.name}: a {human(data_bytes)} cache does not fit in {human(free)} free")
    env, dbs = open_env(cache / "lmdb", map_size_for(cache_max_bytes(data_bytes)))
    catalog = Catalog(env, dbs)
    writer = Writer(env, dbs, catalog)
    per_file = -(-spec.shards // spec.files)  # row groups per file
    log(f"{spec.name}: building {spec.shards:,} shards x {spec.rows} samples ({human(data_bytes)}) in {cache}")
    t0 = time.perf_counter()
    created = time.time()
    encode_s = 0.0

    def shard_txn(first: int, last: int, blocks: list[list[bytes]]) -> Callable[[Any], None]:
        def op(txn: Any) -> None:
            for sid in range(first, last + 1):
                i = sid - 1
                for b, blk in enumerate(blocks[sid - first]):
                    if not txn.put(record_key(sid, b), blk, db=dbs[b"records"], append=True):
                        raise RuntimeError(f"record of shard {sid} block {b} exists")
                s = Shard(id=sid, key=f"c0-u{i}", path=paths[i // per_file], row_group=i % per_file, unit=i,
                          cycle=0, rows=spec.rows, bytes=shard_bytes, rows_per_block=rpb, blocks=spec.blocks,
                          created=created)
                txn.put(u64(sid), s.to_json(), db=dbs[b"shards"], overwrite=False)
        return op

    try:
        sid = 1
        pending = None
        while sid <= spec.shards:
            last = min(spec.shards, sid + spec.per_txn - 1)
            te = time.perf_counter()
            blocks = []
            for s in range(sid, last + 1):
                shard_blocks = []
                for b in range(spec.blocks):
                    y = np.arange(rpb, dtype=np.int64) + ((s - 1) * spec.rows + b * rpb)
                    x = pool[(s * spec.blocks + b) % X_POOL]
                    shard_blocks.append(encode_block(schema, [ColumnData(x), ColumnData(y)], rpb))
                blocks.append(shard_blocks)
            encode_s += time.perf_counter() - te
            if pending is not None:
                pending.result()  # one transaction in flight while the next one's blocks are encoded
            pending = writer.submit(shard_txn(sid, last, blocks))
            sid = last + 1
        if pending is not None:
            pending.result()
        files: dict[str, FileInfo] = {}
        for k, p in enumerate(paths):
            groups = len(range(k * per_file, min(spec.shards, (k + 1) * per_file)))
            files[p] = FileInfo(row_groups=(spec.rows,) * groups, row_group_bytes=(shard_bytes,) * groups,
                                size=(root / "source" / Path(p).name).stat().st_size, seq=1)
        writer.put_files(files).result()
        writer.put_meta({"format": FORMAT_VERSION, "source": source, "schema": schema.to_json(),
                         "skipped_columns": skipped, "arrow_schema": str(arrow_schema(spec.width)),
                         "next_shard": spec.shards + 1}).result()
        commits = writer.commits
    finally:
        writer.close()
        env.close()
    build_s = time.perf_counter() - t0
    lmdb_file = (cache / "lmdb" / "data.mdb").stat().st_size
    log(f"{spec.name}: built in {build_s:.1f}s (encoding {encode_s:.1f}s, {commits} transactions), "
        f"data.mdb {human(lmdb_file)}")
    out = {"params": spec.params(), "source": source, "files": len(paths), "data_bytes": data_bytes,
           "shard_bytes": shard_bytes, "block_bytes": block_len, "samples": spec.samples, "y_sum": spec.y_sum(),
           "max_bytes": cache_max_bytes(data_bytes), "build_s": build_s, "encode_s": encode_s,
           "transactions": commits, "lmdb_file_bytes": lmdb_file}
    write_json(build_path, out)
    return dict(out, reused=False)


def clear_epochs(cache: Path, max_bytes: int) -> None:
    """Forget sealed epochs, their summaries and leases (a reused cache seals epoch 0 afresh)."""
    env, dbs = open_env(cache / "lmdb", map_size_for(max_bytes))
    try:
        with env.begin(write=True) as txn:
            txn.drop(dbs[b"epochs"], delete=False)
            for k in (b"epoch_summaries", b"leases", b"cursor"):
                txn.delete(k, db=dbs[b"meta"])
    finally:
        env.close()


def start_idle(source: str, cache: Path, max_bytes: int, samplers: int = 1) -> tuple[DaemonProcess, dict[str, float]]:
    """The daemon on a built cache, once idle; its start-up times (s): /healthz, /readyz, sampler idle."""
    t0 = time.monotonic()
    d = start_daemon(source, cache, samplers=samplers, max_bytes=max_bytes, log_path=cache.parent / "daemon.log",
                     extra=["--discover-interval", "3600"], timeout=600.0)
    times = {"healthz_s": time.monotonic() - t0}
    try:
        times.update(wait_idle(d, t0, timeout=600.0))
    except BaseException:
        d.stop()
        raise
    return d, times
