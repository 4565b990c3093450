#!/usr/bin/env python
"""The daemon at scale: a 10M-sample manifest to 64 concurrent clients, its RSS, and read rate vs cache size.

    python benchmarks/daemon_scale.py [--shards 100000] [--rows 100] [--clients 64] [--requests 10]
                                      [--read-sizes 1GiB,4GiB] [--json out.json] [--quick] [--workdir DIR]

Targets (from the issue):

* a manifest of 10M samples in 100k shards served with p99 <= 50 ms to 64 concurrent clients;
* daemon RSS <= 300 MB at 10M samples;
* read rate flat (within 10%) from a 1 GB to a 16 GB cache.

Caches are built WITHOUT the remote and without a daemon: the benchmark opens the
LMDB environment with ``samplecache.service.writer.open_env``, builds a ``Catalog``
and a ``Writer`` in-process and submits write transactions of many shards each
(``--per-txn``, default 1000): every block encoded with ``samplecache.record.encode_block``
under a schema from ``samplecache.service.encoder.infer_schema``, shard JSON from
``catalog.Shard``, and the meta keys ``format``, ``source``, ``schema``, ``next_shard``
plus a ``files`` entry per source file whose row groups are exactly the cached
shards. The source is a real local Parquet directory of tiny files with the same
Arrow schema (``file://``; the daemon lists it at start and finds no new file), so
the real daemon (``samplecache serve``, via ``samplecache.launch.DaemonProcess``)
starts on the cache, finds every unit of the source resident and samples nothing.

Part 1, scale (``--shards`` x ``--rows`` tiny samples: ``x`` = fixed_size_list<uint8, 8>, ``y`` = int64):

* build time; daemon start-up time (process start -> /healthz, -> /readyz, -> sampler idle);
* daemon RSS (VmRSS / VmHWM of the daemon process; its sampler processes separately) idle,
  after sealing epoch 0 and after the load; its idle CPU use;
* sealing epoch 0 (the first GET /v1/epochs/0), the manifest's size;
* GET /v1/epochs/0 latency with ``--clients`` concurrent clients (processes x threads, each
  a keep-alive ``http.client`` connection doing ``--requests`` requests, started together):
  p50/p95/p99/max, requests/s and MB/s; plus one client alone as the baseline;
* GET /v1/status latency (idle, sequential).

Verified: the manifest names every shard once (ids 1..N), the sample count and the byte
count equal what was built, every response body is byte-identical to the first one, and
a few shards are read back from LMDB with the client's reader (``y`` values checked).

Part 2, read rate vs cache size (``--read-sizes``): a cache of each size of 16 KiB samples
(``x`` = fixed_size_list<uint8, 16384>, 64 samples = one 1 MiB block, 4 blocks per shard)
is built the same way; epoch 0 is read with ``SampleCacheDataset(url, shuffle=True,
batch_size=64)`` in this process (one warm-up pass, then ``--passes`` timed passes, each
verified: count and sum of ``y``) and with a raw read-only LMDB scan of the same manifest.
The rate of every size is compared with the smallest one. The default sizes are 1 GiB and
4 GiB (disk and time on a shared 2-core machine); ``--read-sizes 1GiB,16GiB`` runs the
issue's comparison where there is room (the largest cache is checked against the free disk
space first, and skipped with a note if it does not fit).

Caches, Parquet sources and logs live under ``--workdir`` (default ./bench-data/scale,
git-ignored) and are reused when their parameters match (the scale cache's epochs and
leases are cleared before each run, so sealing is measured every time).
MB = 10**6 bytes. The exit code is 1 when any verification failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from samplecache.launch import DaemonProcess
from samplecache.record import FORMAT_VERSION, BlockView, ColumnData, Schema, encode_block, record_key, shard_prefix
from samplecache.service.catalog import Catalog, Shard, u64
from samplecache.service.cachedir import map_size_for
from samplecache.service.encoder import infer_schema
from samplecache.service.remote import FsspecRemote
from samplecache.service.cli import human
from samplecache.service.writer import Writer, open_env

sys.path.insert(0, str(Path(__file__).resolve().parent))
from read_throughput import read_json, write_json  # noqa: E402

BENCH_FORMAT = 1
MB = 1e6
GiB = 1 << 30
X_POOL = 16  # distinct x payloads (random bytes), reused across blocks: building stays cheap


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_size(s: str) -> int:
    s = s.strip()
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40, "KB": 10**3, "MB": 10**6,
             "GB": 10**9, "TB": 10**12, "B": 1}
    for u, m in units.items():
        if s.upper().endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(np.ceil(q / 100.0 * len(s))) - 1))
    return s[k]


# --- building a cache without the remote --------------------------------------------------------

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
        files = {p: {"row_groups": [spec.rows] * len(range(k * per_file, min(spec.shards, (k + 1) * per_file))),
                     "row_group_bytes": [shard_bytes] * len(range(k * per_file, min(spec.shards, (k + 1) * per_file))),
                     "size": (root / "source" / Path(p).name).stat().st_size, "seq": 1}
                 for k, p in enumerate(paths)}
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


# --- the daemon -------------------------------------------------------------------------------

def http_get(url: str, timeout: float = 120.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()  # type: ignore[no-any-return]


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM / RssAnon / RssFile of ``pid`` in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def children(pid: int) -> list[int]:
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    kids.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory(pid: int) -> dict[str, Any]:
    st = proc_status(pid)
    kids = [proc_status(k)["VmRSS"] for k in children(pid)]
    return {"rss": st["VmRSS"], "hwm": st["VmHWM"], "anon": st["RssAnon"], "file": st["RssFile"],
            "sampler_rss": kids}


def start_daemon(source: str, cache: Path, max_bytes: int, samplers: int = 1) -> tuple[DaemonProcess, dict[str, float]]:
    """The daemon on a built cache; its start-up times (s): /healthz, /readyz, sampler idle."""
    d = DaemonProcess(source, cache.resolve(), log_path=cache.parent / "daemon.log",
                      extra=["--samplers", str(samplers), "--max-bytes", str(max_bytes), "--log-level", "warning",
                             "--discover-interval", "3600"])
    t0 = time.monotonic()
    d.start(timeout=600.0)
    times = {"healthz_s": time.monotonic() - t0}
    deadline = t0 + 600.0
    ready = idle = None
    while time.monotonic() < deadline and (ready is None or idle is None):
        if ready is None:
            try:
                http_get(d.url + "/readyz", timeout=30)
                ready = time.monotonic() - t0
            except urllib.error.HTTPError:
                pass
        if ready is not None:
            st = json.loads(http_get(d.url + "/v1/status"))
            if st["sampler"]["state"] == "paused" and "whole remote dataset" in (st["sampler"]["reason"] or ""):
                idle = time.monotonic() - t0
            elif st["sampler"]["state"] == "remote error" or st["quarantined"]:
                raise RuntimeError(f"daemon: {st['sampler']} {st['last_error']} {st['quarantined']}")
        if idle is None:
            time.sleep(0.05)
    if ready is None or idle is None:
        d.stop()
        raise TimeoutError(f"daemon not idle after 600 s:\n{d.log_tail()}")
    times.update(readyz_s=ready, idle_s=idle)
    return d, times


def stop_daemon(d: DaemonProcess) -> None:
    code = d.stop()
    if code not in (0, None):
        raise RuntimeError(f"daemon exited with code {code}:\n{d.log_tail()}")


# --- the load: concurrent GET /v1/epochs/0 ---------------------------------------------------------

def _client_thread(port: int, path: str, k: int, expected: bytes, out: dict[str, Any]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    lat, errors, nbytes = [], [], 0
    try:
        for _ in range(k):
            t0 = time.perf_counter()
            try:
                conn.request("GET", path)
                r = conn.getresponse()
                body = r.read()
            except (OSError, http.client.HTTPException) as e:
                errors.append(f"{type(e).__name__}: {e}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                continue
            lat.append(time.perf_counter() - t0)
            nbytes += len(body)
            if r.status != 200 or body != expected:
                errors.append(f"status {r.status}, {len(body)} bytes (expected {len(expected)}), "
                              f"identical: {body == expected}")
    finally:
        conn.close()
    out.update(lat=lat, errors=errors, bytes=nbytes, end=time.time())


def _client_proc(port: int, path: str, threads: int, k: int, expected: bytes, ready: Any, go: Any,
                 q: Any) -> None:
    results: list[dict[str, Any]] = [{} for _ in range(threads)]
    ts = [threading.Thread(target=_client_thread, args=(port, path, k, expected, results[i]))
          for i in range(threads)]
    ready.put(os.getpid())
    go.wait()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put(results)


def load(port: int, path: str, clients: int, k: int, expected: bytes, procs: int) -> dict[str, Any]:
    """``clients`` concurrent keep-alive clients (``procs`` processes x threads), ``k`` requests each,
    released together once every process is up."""
    procs = max(1, min(procs, clients))
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    ctx = mp.get_context("spawn")
    q, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    ps = [ctx.Process(target=_client_proc, args=(port, path, n, k, expected, ready, go, q)) for n in per if n]
    for p in ps:
        p.start()
    for _ in ps:
        ready.get(timeout=300)
    start_at = time.time()
    go.set()
    results: list[dict[str, Any]] = []
    for _ in ps:
        results += q.get(timeout=1800)
    for p in ps:
        p.join()
    lat = [x for r in results for x in r["lat"]]
    errors = [e for r in results for e in r["errors"]]
    wall = max(r["end"] for r in results) - start_at
    nbytes = sum(r["bytes"] for r in results)
    out: dict[str, Any] = {"clients": clients, "processes": len(ps), "requests_per_client": k,
                           "requests": len(lat), "errors": len(errors), "error_examples": errors[:5],
                           "wall_s": wall, "requests_per_s": len(lat) / wall if wall > 0 else None,
                           "mb_per_s": nbytes / MB / wall if wall > 0 else None}
    if lat:
        out.update({f"p{q}_ms": pct(lat, q) * 1e3 for q in (50, 95, 99)})
        out.update(max_ms=max(lat) * 1e3, mean_ms=statistics.fmean(lat) * 1e3)
    return out


def sequential(url: str, n: int) -> dict[str, Any]:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        http_get(url)
        lat.append(time.perf_counter() - t0)
    return {"requests": n, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "max_ms": max(lat) * 1e3}


# --- part 1: scale ----------------------------------------------------------------------------------

def verify_manifest(m: dict[str, Any], spec: CacheSpec, built: dict[str, Any]) -> list[str]:
    problems = []
    shards = m["shards"]
    ids = [s[0] for s in shards]
    if len(shards) != spec.shards:
        problems.append(f"manifest names {len(shards)} shards, built {spec.shards}")
    if ids != list(range(1, spec.shards + 1)):
        problems.append("manifest shard ids are not 1..N in order")
    rows = sum(s[1] for s in shards)
    if rows != spec.samples or m["samples"] != spec.samples:
        problems.append(f"manifest samples {m['samples']} (rows sum {rows}), built {spec.samples}")
    if m["bytes"] != built["data_bytes"] or sum(s[2] for s in shards) != built["data_bytes"]:
        problems.append(f"manifest bytes {m['bytes']}, built {built['data_bytes']}")
    if any(s[3] != spec.rows_per_block for s in shards):
        problems.append("rows per block differ from the build")
    return problems


def verify_records(m: dict[str, Any], spec: CacheSpec, n: int = 16) -> list[str]:
    """Read ``n`` shards spread over the manifest with the client's read-only LMDB handle; check y."""
    from samplecache.reader import open_cache

    schema = Schema.from_json(m["schema"])
    cy = schema.index("y")
    env, db = open_cache(m["lmdb_path"], int(m["map_size"]))
    problems = []
    picks = sorted({int(i) for i in np.linspace(0, len(m["shards"]) - 1, n)})
    with env.begin(buffers=True) as txn:
        cur = txn.cursor(db=db)
        for i in picks:
            sid, rows = m["shards"][i][0], m["shards"][i][1]
            ys = []
            prefix = shard_prefix(sid)
            if cur.set_range(prefix):
                for key, buf in cur:
                    if bytes(key[:8]) != prefix:
                        break
                    ys.append(BlockView(buf, schema).column_array(cy).copy())
            y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
            want = np.arange(rows, dtype=np.int64) + (sid - 1) * spec.rows
            if not np.array_equal(y, want):
                problems.append(f"shard {sid}: y differs from what was built")
    return problems


def run_scale(spec: CacheSpec, root: Path, clients: int, k: int, procs: int) -> dict[str, Any]:
    built = build_cache(spec, root)
    cache = root / "cache"
    clear_epochs(cache, built["max_bytes"])
    problems: list[str] = []
    d, startup = start_daemon(built["source"], cache, built["max_bytes"])
    res: dict[str, Any] = {"spec": spec.params(), "build": built, "startup": startup}
    try:
        pid = d.proc.pid  # type: ignore[union-attr]
        log(f"scale: daemon up: /healthz {startup['healthz_s']:.2f}s, /readyz {startup['readyz_s']:.2f}s, "
            f"sampler idle {startup['idle_s']:.2f}s")
        time.sleep(1.0)
        res["memory_idle"] = memory(pid)
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(5.0)
        res["idle_cpu_fraction"] = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        status = json.loads(http_get(d.url + "/v1/status"))
        if status["samples"] != spec.samples or status["shards"] != spec.shards:
            problems.append(f"/v1/status: {status['samples']} samples in {status['shards']} shards")
        res["status_idle"] = sequential(d.url + "/v1/status", 20)
        log(f"scale: /v1/status p50 {res['status_idle']['p50_ms']:.1f} ms; idle CPU "
            f"{100 * res['idle_cpu_fraction']:.0f}% of a core; RSS {human(res['memory_idle']['rss'])}")

        t = time.perf_counter()
        raw = http_get(d.url + "/v1/epochs/0")
        res["seal_s"] = time.perf_counter() - t
        manifest = json.loads(raw)
        res["manifest_bytes"] = len(raw)
        problems += verify_manifest(manifest, spec, built)
        problems += verify_records(manifest, spec)
        res["memory_sealed"] = memory(pid)
        log(f"scale: sealed epoch 0 in {res['seal_s']:.2f}s: {len(manifest['shards']):,} shards, "
            f"{manifest['samples']:,} samples, {human(len(raw))} of JSON")

        path = "/v1/epochs/0"
        res["single_client"] = load(d.port, path, 1, max(5, k), raw, 1)
        log(f"scale: 1 client: p50 {res['single_client']['p50_ms']:.1f} ms, "
            f"p99 {res['single_client']['p99_ms']:.1f} ms")
        res["concurrent"] = load(d.port, path, clients, k, raw, procs)
        c = res["concurrent"]
        if c["errors"] or c["requests"] != clients * k:
            problems.append(f"{c['errors']} failed/mismatched responses of {clients * k}: {c['error_examples']}")
        log(f"scale: {clients} clients x {k}: p50 {c.get('p50_ms', 0):.1f} ms, p95 {c.get('p95_ms', 0):.1f} ms, "
            f"p99 {c.get('p99_ms', 0):.1f} ms, max {c.get('max_ms', 0):.1f} ms, {c['mb_per_s']:.0f} MB/s")
        compact = http_get(d.url + "/v1/epochs/0?format=compact")  # what the client fetches
        res["compact_manifest_bytes"] = len(compact)
        res["concurrent_compact"] = load(d.port, path + "?format=compact", clients, k, compact, procs)
        c = res["concurrent_compact"]
        if c["errors"] or c["requests"] != clients * k:
            problems.append(f"compact: {c['errors']} failed/mismatched responses: {c['error_examples']}")
        log(f"scale: compact manifest ({human(len(compact))}), {clients} clients x {k}: p50 "
            f"{c.get('p50_ms', 0):.1f} ms, p99 {c.get('p99_ms', 0):.1f} ms, max {c.get('max_ms', 0):.1f} ms")
        res["memory_after_load"] = memory(pid)
        res["status_after_load"] = sequential(d.url + "/v1/status", 20)
    finally:
        stop_daemon(d)
    res["problems"] = problems
    res["verified"] = not problems
    return res


# --- part 2: read rate vs cache size --------------------------------------------------------------

def read_spec(size: int, quick: bool) -> CacheSpec:
    width = 4096 if quick else 16384
    rows, blocks = (64, 4) if not quick else (32, 2)
    shard = rows * width
    return CacheSpec(name=f"read-{human(size).replace(' ', '')}", shards=max(2, size // shard), rows=rows,
                     blocks=blocks, width=width, files=1, per_txn=16)


def resident_fraction(path: Path) -> float | None:
    """The fraction of ``path`` in the page cache (util-linux ``fincore``), or None where it is missing."""
    exe = shutil.which("fincore")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", str(path)],
                             capture_output=True, text=True, timeout=60).stdout.split()
        return int(out[0]) / max(1, int(out[1]))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def client_pass(url: str, batch: int) -> tuple[int, int, float]:
    from samplecache import SampleCacheDataset

    ds = SampleCacheDataset(url, shuffle=True, batch_size=batch)
    ds.set_epoch(0)
    n = ysum = 0
    t0 = time.perf_counter()
    for b in ds:
        y = b["y"]
        n += int(y.shape[0])
        ysum += int(y.sum())
    return n, ysum, time.perf_counter() - t0


def lmdb_pass(m: dict[str, Any]) -> tuple[int, int, float]:
    """Raw read: shard by shard of the manifest, every block's x copied once."""
    from samplecache.reader import open_cache

    schema = Schema.from_json(m["schema"])
    cx, cy = schema.index("x"), schema.index("y")
    env, db = open_cache(m["lmdb_path"], int(m["map_size"]))
    n = ysum = 0
    t0 = time.perf_counter()
    for sid, _rows, _b, _rpb in m["shards"]:
        prefix = shard_prefix(sid)
        with env.begin(buffers=True) as txn:
            cur = txn.cursor(db=db)
            if cur.set_range(prefix):
                for key, buf in cur:
                    if bytes(key[:8]) != prefix:
                        break
                    v = BlockView(buf, schema)
                    v.column_array(cx).copy()
                    ysum += int(v.column_array(cy).sum())
                    n += v.nrows
    return n, ysum, time.perf_counter() - t0


def run_read(sizes: list[int], root: Path, passes: int, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": [], "problems": []}
    for size in sizes:
        spec = read_spec(size, quick)
        sroot = root / spec.name
        try:
            built = build_cache(spec, sroot)
        except RuntimeError as e:
            out["sizes"].append({"size": size, "skipped": str(e)})
            log(f"read: {e}: skipped")
            continue
        row: dict[str, Any] = {"size": size, "spec": spec.params(), "data_bytes": built["data_bytes"],
                               "build_s": built["build_s"], "client": [], "lmdb": []}
        d, startup = start_daemon(built["source"], sroot / "cache", built["max_bytes"])
        row["startup"] = startup
        try:
            m = json.loads(http_get(d.url + "/v1/epochs/0"))
            if m["samples"] != spec.samples or len(m["shards"]) != spec.shards:
                out["problems"].append(f"{spec.name}: manifest {m['samples']} samples / {len(m['shards'])} shards")
            payload = spec.samples * spec.width
            data_mdb = sroot / "cache" / "lmdb" / "data.mdb"
            row["page_cache_before"] = resident_fraction(data_mdb)
            for kind, fn in (("lmdb", lambda: lmdb_pass(m)), ("client", lambda: client_pass(d.url, spec.rows_per_block))):
                for i in range(passes + 1):
                    n, ysum, dt = fn()
                    ok = n == spec.samples and ysum == spec.y_sum()
                    if not ok:
                        out["problems"].append(f"{spec.name} {kind} pass {i}: {n} samples, y sum {ysum}")
                    row[kind].append({"warmup": i == 0, "seconds": dt, "ok": ok, "mb_per_s": payload / MB / dt,
                                      "page_cache_after": resident_fraction(data_mdb)})
                timed = [p["mb_per_s"] for p in row[kind] if not p["warmup"]]
                row[f"{kind}_mb_per_s"] = statistics.median(timed)
                row[f"{kind}_best_mb_per_s"] = max(timed)
                log(f"read: {spec.name} {kind}: {row[f'{kind}_mb_per_s']:,.0f} MB/s "
                    f"(passes {[round(x) for x in timed]})")
        finally:
            stop_daemon(d)
        out["sizes"].append(row)
    measured = [r for r in out["sizes"] if "client_mb_per_s" in r]
    if measured:
        base = measured[0]
        for r in measured:
            r["client_vs_smallest"] = r["client_mb_per_s"] / base["client_mb_per_s"]
            r["lmdb_vs_smallest"] = r["lmdb_mb_per_s"] / base["lmdb_mb_per_s"]
            r["client_best_vs_smallest"] = r["client_best_mb_per_s"] / base["client_best_mb_per_s"]
    out["verified"] = not out["problems"]
    return out


# --- output -----------------------------------------------------------------------------------------

def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def report(res: dict[str, Any]) -> str:
    lines = []
    s = res.get("scale")
    if s:
        sp = s["spec"]
        c, one = s["concurrent"], s["single_client"]
        mem = [("idle", s["memory_idle"]), ("epoch 0 sealed", s["memory_sealed"]),
               ("after the load", s["memory_after_load"])]
        lines += [f"scale: {sp['shards']:,} shards x {sp['rows']} samples = {sp['shards'] * sp['rows']:,} samples "
                  f"({human(s['build']['data_bytes'])} of records), verified: {'yes' if s['verified'] else 'NO'}",
                  "",
                  f"{'what':<34} {'value':>14}  target",
                  "-" * 60,
                  f"{'build (in-process writer)':<34} {s['build']['build_s']:>12.1f} s"
                  + ("  (an earlier run's: cache reused)" if s["build"].get("reused") else ""),
                  f"{'start: process -> /healthz':<34} {s['startup']['healthz_s']:>12.2f} s",
                  f"{'start: process -> sampler idle':<34} {s['startup']['idle_s']:>12.2f} s",
                  f"{'seal epoch 0 (first GET)':<34} {s['seal_s'] * 1e3:>11.0f} ms",
                  f"{'manifest size':<34} {s['manifest_bytes'] / MB:>11.2f} MB"]
        for name, m in mem:
            lines.append(f"{'daemon RSS, ' + name:<34} {m['rss'] / MB:>11.0f} MB  <= 300 MB; anon {m['anon'] / MB:.0f} MB, "
                         f"file {m['file'] / MB:.0f} MB" + ("" if name != "after the load" else f", peak {m['hwm'] / MB:.0f} MB"))
        lines += [f"{'sampler process RSS':<34} {fmt(max(s['memory_idle']['sampler_rss'], default=None) and max(s['memory_idle']['sampler_rss']) / MB, '.0f'):>11} MB  (each, separate)",
                  f"{'daemon CPU while idle':<34} {100 * s['idle_cpu_fraction']:>12.1f} %  of one core",
                  f"{'GET /v1/status p50 / p99 (idle)':<34} {s['status_idle']['p50_ms']:>6.1f} / {s['status_idle']['p99_ms']:<5.1f} ms",
                  "",
                  f"GET /v1/epochs/0 ({s['manifest_bytes'] / MB:.2f} MB each)",
                  f"{'clients':>7} {'requests':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} "
                  f"{'req/s':>7} {'MB/s':>7} {'errors':>6}"]
        for r in (one, c):
            lines.append(f"{r['clients']:>7} {r['requests']:>8} {fmt(r.get('p50_ms'), '.1f'):>8} "
                         f"{fmt(r.get('p95_ms'), '.1f'):>8} {fmt(r.get('p99_ms'), '.1f'):>8} {fmt(r.get('max_ms'), '.1f'):>8} "
                         f"{fmt(r['requests_per_s'], '.1f'):>7} {fmt(r['mb_per_s'], '.0f'):>7} {r['errors']:>6}")
        lines.append(f"target: p99 <= 50 ms with 64 concurrent clients; the clients run on the same host")
        if s["problems"]:
            lines += ["", "PROBLEMS:"] + [f"  {p}" for p in s["problems"]]
    r = res.get("read")
    if r:
        lines += ["", "read rate vs cache size (epoch 0, warm; median of the timed passes; MB = 1e6 B of x payload)",
                  f"{'cache':>10} {'samples':>10} {'lmdb MB/s':>10} {'x smallest':>10} {'client MB/s':>12} "
                  f"{'x smallest':>10} {'best':>6} {'cached':>7}  verified"]
        for row in r["sizes"]:
            if "skipped" in row:
                lines.append(f"{human(row['size']):>10}  skipped: {row['skipped']}")
                continue
            ok = all(p["ok"] for p in row["lmdb"] + row["client"])
            fr = [p["page_cache_after"] for p in row["lmdb"] + row["client"] if p["page_cache_after"] is not None]
            cached = min(fr) if fr else None
            lines.append(f"{human(row['data_bytes']):>10} {row['spec']['shards'] * row['spec']['rows']:>10,} "
                         f"{row['lmdb_mb_per_s']:>10,.0f} {fmt(row.get('lmdb_vs_smallest'), '.2f'):>10} "
                         f"{row['client_mb_per_s']:>12,.0f} {fmt(row.get('client_vs_smallest'), '.2f'):>10} "
                         f"{fmt(row.get('client_best_vs_smallest'), '.2f'):>6} {fmt(cached, '.0%'):>7}  "
                         f"{'yes' if ok else 'NO'}")
        lines.append("target: the client's rate within 10% (x smallest >= 0.90) from 1 GB to 16 GB; "
                     "'best' compares the best passes; 'cached' = the least of data.mdb found in the page "
                     "cache after a pass (fincore)")
        if r["problems"]:
            lines += ["", "PROBLEMS:"] + [f"  {p}" for p in r["problems"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=None, help="shards of the scale cache (default 100000; --quick 2000)")
    p.add_argument("--rows", type=int, default=100, help="samples per shard of the scale cache (default 100)")
    p.add_argument("--files", type=int, default=None, help="source files of the scale cache (default shards/1000)")
    p.add_argument("--per-txn", type=int, default=1000, help="shards per build transaction (default 1000)")
    p.add_argument("--clients", type=int, default=64, help="concurrent manifest clients (default 64)")
    p.add_argument("--requests", type=int, default=None, help="requests per client (default 10; --quick 3)")
    p.add_argument("--client-procs", type=int, default=4, help="processes the clients are spread over (default 4)")
    p.add_argument("--read-sizes", default=None,
                   help="cache sizes of the read-rate part (default 1GiB,4GiB; --quick 16MiB,64MiB; '' skips it)")
    p.add_argument("--passes", type=int, default=None, help="timed read passes per size (default 3; --quick 1)")
    p.add_argument("--no-scale", action="store_true", help="skip part 1")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    p.add_argument("--workdir", type=Path, default=Path("bench-data") / "scale",
                   help="caches and sources (default ./bench-data/scale)")
    a = p.parse_args(argv)

    quick = a.quick
    shards = a.shards if a.shards is not None else (2_000 if quick else 100_000)
    files = a.files if a.files is not None else max(1, shards // 1000)
    k = a.requests if a.requests is not None else (3 if quick else 10)
    passes = a.passes if a.passes is not None else (1 if quick else 3)
    sizes_arg = a.read_sizes if a.read_sizes is not None else ("16MiB,64MiB" if quick else "1GiB,4GiB")
    sizes = [parse_size(x) for x in sizes_arg.split(",") if x.strip()]
    if shards < 1 or a.rows < 1 or k < 1 or a.clients < 1 or passes < 1:
        p.error("--shards, --rows, --requests, --clients and --passes must be >= 1")

    t0 = time.perf_counter()
    load_start = os.getloadavg()
    root = a.workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"benchmark": "daemon_scale", "bench_format": BENCH_FORMAT, "quick": quick}
    if not a.no_scale:
        spec = CacheSpec("scale", shards=shards, rows=a.rows, blocks=1, width=8, files=files, per_txn=a.per_txn)
        res["scale"] = run_scale(spec, root / "scale", a.clients, k, a.client_procs)
    if sizes:
        res["read"] = run_read(sizes, root, passes, quick)
    res["seconds"] = time.perf_counter() - t0
    res["host"] = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                   "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "numpy": np.__version__,
                   "pyarrow": pa.__version__}
    res["verified"] = all(res[p]["verified"] for p in ("scale", "read") if p in res)
    print()
    print(report(res))
    print(f"\nload average {load_start[0]:.2f} -> {res['host']['loadavg_end'][0]:.2f} on {os.cpu_count()} cores: "
          f"numbers are noisy on a shared machine")
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=2))
    return 0 if res["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
