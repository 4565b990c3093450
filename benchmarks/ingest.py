#!/usr/bin/env python
"""Ingest rate: S3 server -> LMDB against the raw s3fs read rate of the same bytes.

    python benchmarks/ingest.py [--large-mb 200] [--small-mb 200] [--samplers 2] [--passes 2]
                                [--json out.json] [--quick] [--workdir DIR] [--py-spy]

Target (from the issue): "Ingest: S3 server -> LMDB at >= 0.8x the raw s3fs read rate of the same
bytes (the samplers must not be the bottleneck)".

A real S3 server (SeaweedFS, ``tests/s3server.S3Server``) runs on loopback; two Parquet datasets
are generated and uploaded (random, incompressible, written uncompressed):

* LARGE: ``--large-mb`` MB of ``x`` = fixed_size_list<float32, 262144> (1 MiB) + int64 ``y``,
  16 rows (16.8 MB) per row group, 4 row groups per file;
* SMALL: ``--small-mb`` MB of ``x`` = fixed_size_list<uint8, 256> + int64 ``y``,
  50,000 rows (13.2 MB) per row group, 4 row groups per file.

For each dataset:

a. raw: every row group's byte range (its column chunks are contiguous: one range per row group)
   read with ``s3fs.S3FileSystem.cat_file`` by ``--samplers`` reader processes (one s3fs each,
   like the samplers), one untimed warm-up pass, then ``--passes`` timed passes (median), and
   once more after the daemon ran (the server's page cache and the machine's load drift);
b. daemon: ``samplecache serve --source s3://... --samplers N`` on a fresh cache, timed from the
   process start until ``/v1/status`` reports every sample resident. Start-up (process start ->
   ``/healthz``: imports, footer discovery, sampler spawn) is reported apart; the ingest rate is
   over the time after ``/healthz`` and, as a steady-state cross-check, over the span of the
   shards' ``created`` stamps. Rates are in Parquet bytes of the row groups (the same bytes as
   the raw read) and in LMDB payload bytes (encoded blocks). Verified: the sealed epoch 0 is read
   back from LMDB (sample count and sum of ``y`` equal the source's);
c. where a sampler's time goes: every unit run in this process, stage by stage, exactly as
   ``samplecache.service.sampler.run_task`` does it (open + footer, read_row_group, encode_table,
   write_staged with its fsyncs) and then ingested by a ``Writer`` into a scratch LMDB (one
   transaction per shard, like the daemon); read variants on the same units for comparison
   (informational: pyarrow's own S3 filesystem, one ranged GET per row group, the footer known);
   and the top functions of a cProfile of ``run_task`` on one unit. ``--py-spy`` also samples the
   daemon and its samplers (``py-spy record --subprocesses``) during (b) and prints the top frames.

MB = 10**6 bytes. The exit code is 1 when any verification failed.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing as mp
import os
import platform
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from s3server import S3Server  # noqa: E402

from samplecache.launch import DaemonProcess  # noqa: E402
from samplecache.record import BlockView, Schema, shard_prefix  # noqa: E402

BENCH_FORMAT = 1
MB = 1e6
BUCKET = "samplecache-bench"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- datasets -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    name: str
    samples: int
    row_group: int
    rows_per_file: int
    dtype: str
    width: int
    seed: int

    @property
    def payload(self) -> int:
        return self.width * np.dtype(self.dtype).itemsize


def make_specs(large_mb: float, small_mb: float, quick: bool) -> dict[str, Spec]:
    lrg, srg = (4, 5_000) if quick else (16, 50_000)
    nl = max(lrg, int(large_mb * MB / (1 << 20)) // lrg * lrg)
    ns = max(srg, int(small_mb * MB / 264) // srg * srg)
    return {"large": Spec("large", nl, lrg, 4 * lrg, "float32", 262_144, seed=11),
            "small": Spec("small", ns, srg, 4 * srg, "uint8", 256, seed=12)}


def upload(spec: Spec, s3: S3Server, prefix: str) -> dict[str, Any]:
    """Generate and upload ``spec`` under ``BUCKET/prefix``; the truth and every row group's byte range."""
    fs = s3.fs()
    rng = np.random.default_rng(spec.seed)
    item = pa.from_numpy_dtype(np.dtype(spec.dtype))
    schema = pa.schema([("x", pa.list_(item, spec.width)), ("y", pa.int64())])
    y_sum, done, file_no = 0, 0, 0
    t0 = time.perf_counter()
    while done < spec.samples:
        rows_in_file = min(spec.rows_per_file, spec.samples - done)
        with fs.open(f"{BUCKET}/{prefix}/part-{file_no:05d}.parquet", "wb") as f:
            with pq.ParquetWriter(f, schema, compression="none", use_dictionary=False, write_statistics=False) as w:
                start = 0
                while start < rows_in_file:
                    n = min(spec.row_group, rows_in_file - start)
                    if spec.dtype == "uint8":
                        flat = rng.integers(0, 256, size=n * spec.width, dtype=np.uint8)
                    else:
                        flat = rng.random(n * spec.width, dtype=np.float32)
                    y = rng.integers(0, 1 << 31, size=n, dtype=np.int64)
                    x = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=item), spec.width)
                    w.write_table(pa.Table.from_arrays([x, pa.array(y)], schema=schema), row_group_size=n)
                    y_sum += int(y.sum())
                    start += n
        done += rows_in_file
        file_no += 1
    upload_s = time.perf_counter() - t0
    ranges, file_bytes = [], 0
    for path in sorted(fs.find(f"{BUCKET}/{prefix}")):
        with fs.open(path, "rb", block_size=1 << 20) as f:
            md = pq.ParquetFile(f).metadata
            file_bytes += f.size
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            starts = []
            for j in range(rg.num_columns):
                cc = rg.column(j)
                first = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
                starts.append((first, first + cc.total_compressed_size))
            lo, hi = min(s for s, _ in starts), max(e for _, e in starts)
            ranges.append((path, lo, hi - lo, i))
    raw = sum(r[2] for r in ranges)
    log(f"{spec.name}: uploaded {spec.samples:,} samples in {file_no} files, {len(ranges)} row groups, "
        f"{raw / MB:,.1f} MB of row groups in {upload_s:.1f}s")
    return {"samples": spec.samples, "y_sum": y_sum, "files": file_no, "row_groups": len(ranges),
            "row_group_bytes": raw, "file_bytes": file_bytes, "ranges": ranges, "url": f"s3://{BUCKET}/{prefix}"}


# --- (a) raw s3fs reads ---------------------------------------------------------------------------

def _reader(opts: dict[str, Any], tasks: list[tuple[str, int, int, int]], ready: Any, go: Any, q: Any) -> None:
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
    t0 = time.time()
    try:
        for path, start, length, _ in tasks:
            n += len(fs.cat_file(path, start=start, end=start + length))
    except BaseException as e:
        q.put(f"{type(e).__name__}: {e}")
        return
    q.put((n, t0, time.time()))


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores, every process: the S3 server included)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def raw_pass(opts: dict[str, Any], ranges: list[tuple[str, int, int, int]], readers: int) -> dict[str, float]:
    """Every range once, split round-robin over ``readers`` processes; wall time from the common start."""
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
        t0, busy0 = time.time(), machine_busy_s()
        go.set()
        got = [q.get(timeout=1800) for _ in ps]
        busy = machine_busy_s() - busy0
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
    return {"seconds": wall, "bytes": nbytes, "mb_per_s": nbytes / MB / wall,
            "cpu_ms_per_mb": 1000 * busy / (nbytes / MB), "cores_busy": busy / wall}


# --- (b) the daemon ---------------------------------------------------------------------------------

def http_json(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def all_shards(url: str) -> list[dict[str, Any]]:
    out, offset = [], 0
    while True:
        page = http_json(f"{url}/v1/shards?offset={offset}&limit=1000")
        out += page["shards"]
        offset += len(page["shards"])
        if not page["shards"] or offset >= page["total"]:
            return out


def lmdb_check(manifest: dict[str, Any]) -> tuple[int, int]:
    """(samples, sum of y) read back from the cache's LMDB (read-only, as the client opens it)."""
    from samplecache.reader import open_cache

    schema = Schema.from_json(manifest["schema"])
    cy = schema.index("y")
    env, db = open_cache(manifest["lmdb_path"], int(manifest["map_size"]))
    n = ysum = 0
    with env.begin(buffers=True) as txn:
        cur = txn.cursor(db=db)
        for sid, _rows, _b, _rpb in manifest["shards"]:
            prefix = shard_prefix(sid)
            if cur.set_range(prefix):
                for key, buf in cur:
                    if bytes(key[:8]) != prefix:
                        break
                    v = BlockView(buf, schema)
                    ysum += int(v.column_array(cy).sum())
                    n += v.nrows
    env.close()
    from samplecache import reader as _reader_mod
    _reader_mod._ENVS.pop(manifest["lmdb_path"], None)
    return n, ysum


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def summarize_raw_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Busy samples of ``py-spy record --subprocesses -f raw``: by process (the daemon or a sampler), self
    time by frame in each, and inclusive time of samplecache's own functions."""
    from collections import Counter
    self_t: dict[str, Counter[str]] = {"daemon": Counter(), "sampler": Counter()}
    incl, procs, n = Counter(), Counter(), 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = stack.split(";")
        if frames[-1].startswith(IDLE_FRAMES):
            continue
        owners = [f for f in frames if f.startswith("process ")]
        kind = "sampler" if owners and "spawn_main" in owners[-1] else "daemon"
        frames = [f for f in frames if not f.startswith("process ")]
        if not frames:
            continue
        n += c
        procs[kind] += c
        self_t[kind][frames[-1]] += c
        for f in set(frames):
            if "service/" in f or "client/" in f:
                incl[f] += c
    return {"samples": n, "by_process": dict(procs),
            "self": {k: v.most_common(top) for k, v in self_t.items()},
            "samplecache_inclusive": incl.most_common(top)}


IDLE_FRAMES = ("select (", "wait (", "_PollLikeSelector.select", "EpollSelector.select", "Condition.wait",
               "Event.wait", "_recv_bytes", "_recv (", "poll (", "Queue.get", "sleep (")


def ingest_run(spec: Spec, truth: dict[str, Any], s3: S3Server, root: Path, samplers: int,
               spy: bool) -> dict[str, Any]:
    cache = root / f"cache-{spec.name}"
    if cache.exists():
        shutil.rmtree(cache)
    max_bytes = 3 * truth["row_group_bytes"] + (1 << 30)
    d = DaemonProcess(truth["url"] + "/", cache, env=s3.env(), log_path=root / f"daemon-{spec.name}.log",
                      extra=["--samplers", str(samplers), "--max-bytes", str(max_bytes), "--log-level", "info"])
    res: dict[str, Any] = {"samplers": samplers}
    spy_proc = None
    t0 = time.monotonic()
    d.start(ready=False)
    try:
        d.wait_ready(timeout=300)
        res["healthz_s"] = time.monotonic() - t0
        busy0 = machine_busy_s()
        if spy and py_spy():
            prof = root / f"py-spy-{spec.name}.txt"
            spy_proc = subprocess.Popen([py_spy(), "record", "--pid", str(d.proc.pid), "--subprocesses",  # type: ignore[union-attr]
                                         "-r", "97", "-f", "raw", "-o", str(prof), "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first = None
        budget = 300 + truth["row_group_bytes"] / 2e6  # >= 2 MB/s, plus start-up
        while True:
            st = http_json(d.url + "/v1/status")
            now = time.monotonic() - t0
            if st["quarantined"]:
                raise RuntimeError(f"quarantined: {st['quarantined']}")
            if first is None and st["samples"] > 0:
                first = now
            if st["samples"] >= spec.samples:
                res["done_s"] = now
                res["busy_s"] = machine_busy_s() - busy0
                break
            if d.proc is not None and d.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {d.proc.returncode}:\n{d.log_tail()}")
            if now > budget:
                raise TimeoutError(f"{spec.name}: {st['samples']} of {spec.samples} after {now:.0f}s "
                                   f"({st['last_error']})\n{d.log_tail()}")
            time.sleep(0.05)
        if spy_proc is not None:
            spy_proc.send_signal(signal.SIGINT)
            try:
                spy_proc.wait(60)
            except subprocess.TimeoutExpired:
                spy_proc.kill()
            if prof.exists():
                res["py_spy"] = summarize_raw_profile(prof)
                res["py_spy_file"] = str(prof)
            spy_proc = None
        res["first_shard_s"] = first
        st = http_json(d.url + "/v1/status")
        res["status"] = {k: st[k] for k in ("samples", "shards", "bytes")}
        res["status"]["ingest"] = st["ingest"]
        res["status"]["lmdb"] = st["lmdb"]
        res["remote_errors"] = st["remote_errors"]
        shards = all_shards(d.url)
        created = sorted(s["created"] for s in shards)
        res["lmdb_payload_bytes"] = st["bytes"]
        manifest = http_json(d.url + "/v1/epochs/0?min_samples=1&timeout=30", timeout=120)
    finally:
        if spy_proc is not None:
            spy_proc.kill()
        code = d.stop()
    if code not in (0, None):
        raise RuntimeError(f"daemon exited with code {code}:\n{d.log_tail()}")
    n, ysum = lmdb_check(manifest)
    res["verified"] = n == truth["samples"] and ysum == truth["y_sum"] and manifest["samples"] == truth["samples"]
    res["check"] = {"samples": n, "y_sum": ysum, "expected_samples": truth["samples"], "expected_y_sum": truth["y_sum"]}
    ingest_s = res["done_s"] - res["healthz_s"]
    res["ingest_s"] = ingest_s
    res["mb_per_s"] = truth["row_group_bytes"] / MB / ingest_s               # Parquet bytes, after /healthz
    res["mb_per_s_total"] = truth["row_group_bytes"] / MB / res["done_s"]    # from the process start
    res["lmdb_mb_per_s"] = res["lmdb_payload_bytes"] / MB / ingest_s
    res["cpu_ms_per_mb"] = 1000 * res["busy_s"] / (truth["row_group_bytes"] / MB)
    res["cores_busy"] = res["busy_s"] / ingest_s
    if len(created) > 2:
        span = created[-1] - created[0]
        # n-1 shards' worth of bytes arrived over the span between the first and last commit
        res["steady_mb_per_s"] = truth["row_group_bytes"] * (len(created) - 1) / len(created) / MB / span
        res["shard_span_s"] = span
    res["shards"] = len(created)
    return res


# --- (c) where a sampler's time goes ------------------------------------------------------------------

def stage_profile(spec: Spec, truth: dict[str, Any], s3: S3Server, scratch: Path, max_units: int) -> dict[str, Any]:
    """Each unit through run_task's steps in this process, timed per stage, then ingested by a Writer."""
    from samplecache.service.catalog import Catalog
    from samplecache.service.encoder import encode_table, infer_schema
    from samplecache.service.remote import OPEN_BLOCK_SIZE, FsspecRemote
    from samplecache.service.staging import write_staged
    from samplecache.service.writer import Writer, open_env

    os.environ.update(s3.env())  # s3fs (botocore) reads the endpoint and the credentials from here
    remote = FsspecRemote(truth["url"], {})
    units = truth["ranges"][:max_units]
    _, arrow_schema = remote.file_info(units[0][0])
    schema, _ = infer_schema(arrow_schema)
    staging = scratch / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    env, dbs = open_env(scratch / "lmdb", 8 * truth["row_group_bytes"] + (1 << 30))
    catalog = Catalog(env, dbs)
    writer = Writer(env, dbs, catalog)
    stages: dict[str, list[float]] = {k: [] for k in ("open_footer", "read_row_group", "encode", "stage_write",
                                                       "stage_fsync", "lmdb_ingest")}
    nbytes = rows = 0
    try:
        for k, (path, _start, length, rg) in enumerate(units):
            t0 = time.perf_counter()
            with remote.fs.open(path, "rb", block_size=OPEN_BLOCK_SIZE) as f:
                pf = pq.ParquetFile(f)
                t1 = time.perf_counter()
                table = pf.read_row_group(rg, columns=schema.names)
            t2 = time.perf_counter()
            blocks, rpb = encode_table(table, schema)
            t3 = time.perf_counter()
            header = {"key": f"p-{k}", "path": path, "row_group": rg, "unit": k, "cycle": 0,
                      "rows": table.num_rows, "rows_per_block": rpb}
            # write_staged, with the fsync timed apart (same steps: tmp, write, flush, fsync, rename, fsync dir)
            staged = _write_staged_timed(write_staged, staging, header["key"], header, blocks, stages)
            t4 = time.perf_counter()
            writer.ingest(staged).result()
            t5 = time.perf_counter()
            stages["open_footer"].append(t1 - t0)
            stages["read_row_group"].append(t2 - t1)
            stages["encode"].append(t3 - t2)
            stages["lmdb_ingest"].append(t5 - t4)
            nbytes += length
            rows += table.num_rows
            del table, blocks
    finally:
        writer.close()
        env.close()
    total = sum(sum(v) for v in stages.values())
    out = {"units": len(units), "bytes": nbytes, "rows": rows, "total_s": total,
           "mb_per_s_one_process": nbytes / MB / total,
           "stages": {k: {"seconds": sum(v), "share": sum(v) / total, "mb_per_s": nbytes / MB / sum(v) if sum(v) else None}
                      for k, v in stages.items()}}
    return out


def _write_staged_timed(write_staged: Callable[..., Path], directory: Path, name: str, header: dict[str, Any],
                        blocks: list[bytes], stages: dict[str, list[float]]) -> Path:
    """write_staged, timed: the whole call, and its fsyncs measured by wrapping os.fsync."""
    real = os.fsync
    spent = [0.0]

    def timed_fsync(fd: int) -> None:
        t = time.perf_counter()
        real(fd)
        spent[0] += time.perf_counter() - t

    os.fsync = timed_fsync  # type: ignore[assignment]
    try:
        t = time.perf_counter()
        path = write_staged(directory, name, header, blocks)
        whole = time.perf_counter() - t
    finally:
        os.fsync = real  # type: ignore[assignment]
    stages["stage_write"].append(whole - spent[0])
    stages["stage_fsync"].append(spent[0])
    return path


def read_variants(truth: dict[str, Any], s3: S3Server, max_units: int) -> dict[str, Any]:
    """Read the same units several ways (read only, one process): what the read step could cost."""
    from samplecache.service.remote import OPEN_BLOCK_SIZE, FsspecRemote

    os.environ.update(s3.env())
    remote = FsspecRemote(truth["url"], {})
    fs = remote.fs
    units = truth["ranges"][:max_units]
    nbytes = sum(u[2] for u in units)
    footers = {}
    for path in sorted({u[0] for u in units}):
        with fs.open(path, "rb", block_size=OPEN_BLOCK_SIZE) as f:
            footers[path] = pq.ParquetFile(f).metadata

    def current() -> None:  # FsspecRemote.read_row_group: open (HEAD), footer, column chunks
        for path, _s, _n, rg in units:
            remote.read_row_group(path, rg, ["x", "y"])

    def known_footer() -> None:  # the footer from discovery (metadata=), the same file object otherwise
        for path, _s, _n, rg in units:
            with fs.open(path, "rb", block_size=OPEN_BLOCK_SIZE) as f:
                pq.ParquetFile(f, metadata=footers[path]).read_row_group(rg, columns=["x", "y"])

    def one_get() -> None:  # one ranged GET of the whole row group, parsed from memory with the known footer
        for path, start, length, rg in units:
            data = fs.cat_file(path, start=start, end=start + length)
            _parse_range(data, start, footers[path], rg)

    def raw_only() -> None:
        for path, start, length, _rg in units:
            fs.cat_file(path, start=start, end=start + length)

    out: dict[str, Any] = {"units": len(units), "bytes": nbytes}
    variants: list[tuple[str, Callable[[], None]]] = [("raw cat_file (no parse)", raw_only),
                                                      ("FsspecRemote.read_row_group (now)", current),
                                                      ("same, footer known (metadata=)", known_footer),
                                                      ("one ranged GET + parse in memory", one_get)]
    try:
        from pyarrow import fs as pafs
        endpoint = s3.endpoint.split("://", 1)
        s3n = pafs.S3FileSystem(access_key=s3.key, secret_key=s3.secret, endpoint_override=endpoint[1],
                                scheme=endpoint[0], region="us-east-1")

        def arrow_native() -> None:  # pyarrow's C++ S3 client: parallel ranged reads, no GIL
            for path, _s, _n, rg in units:
                with s3n.open_input_file(path) as f:
                    pq.ParquetFile(f, metadata=footers[path]).read_row_group(rg, columns=["x", "y"])
        variants.append(("pyarrow.fs.S3FileSystem, footer known", arrow_native))
    except Exception as e:  # noqa: BLE001 - informational only
        out["arrow_native_error"] = f"{type(e).__name__}: {e}"
    rows = []
    for name, fn in variants:
        fn()  # warm-up (connections, server page cache)
        times = []
        for _ in range(2):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        best = min(times)
        rows.append({"variant": name, "seconds": best, "mb_per_s": nbytes / MB / best})
    out["rows"] = rows
    return out


class _RangeFile(io.RawIOBase):
    """A read-only file over one byte range of a remote file (the rest of it is never read)."""

    def __init__(self, data: bytes, offset: int, size: int) -> None:
        self.data, self.offset, self.size, self.pos = memoryview(data), offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else (self.pos + pos if whence == 1 else self.size + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        lo = self.pos - self.offset
        if lo < 0 or lo > len(self.data):
            raise OSError(f"read outside the fetched range at {self.pos}")
        n = min(len(b), len(self.data) - lo)
        b[:n] = self.data[lo:lo + n]
        self.pos += n
        return n


def _parse_range(data: bytes, start: int, md: Any, rg: int) -> pa.Table:
    size = 1 << 62  # any size past the range: only the row group's bytes are read (the footer is known)
    f = _RangeFile(data, start, size)
    return pq.ParquetFile(f, metadata=md, pre_buffer=False).read_row_group(rg, columns=["x", "y"])


def cprofile_unit(truth: dict[str, Any], s3: S3Server, scratch: Path, top: int = 14) -> str:
    from samplecache.service.encoder import infer_schema
    from samplecache.service.remote import FsspecRemote
    from samplecache.service.sampler import SampleTask, run_task

    os.environ.update(s3.env())
    path, _s, _n, rg = truth["ranges"][0]
    _, arrow_schema = FsspecRemote(truth["url"], {}).file_info(path)
    schema, _ = infer_schema(arrow_schema)
    staging = scratch / "cprofile"
    staging.mkdir(parents=True, exist_ok=True)
    task = SampleTask(key="cprof", source=truth["url"], storage_options={}, path=path, row_group=rg,
                      schema=schema.to_json(), staging_dir=str(staging), block_bytes=1 << 20)
    r = run_task(task)  # warm: imports, the s3fs instance
    prof = cProfile.Profile()
    prof.enable()
    r = run_task(dataclass_replace(task, key="cprof2"))
    prof.disable()
    if not r.ok:
        return f"run_task failed: {r.error}"
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def dataclass_replace(obj: Any, **kw: Any) -> Any:
    import dataclasses
    return dataclasses.replace(obj, **kw)


# --- driver ---------------------------------------------------------------------------------------

def run_dataset(spec: Spec, s3: S3Server, root: Path, samplers: int, passes: int, spy: bool,
                profile_units: int, variants: bool) -> dict[str, Any]:
    truth = upload(spec, s3, spec.name)
    opts = dict(key=s3.key, secret=s3.secret, client_kwargs={"endpoint_url": s3.endpoint},
                skip_instance_cache=True, use_listings_cache=False)
    res: dict[str, Any] = {"spec": asdict(spec), "truth": {k: v for k, v in truth.items() if k != "ranges"}}
    raw_pass(opts, truth["ranges"], samplers)  # warm-up: the server's page cache, the connections
    raws = [raw_pass(opts, truth["ranges"], samplers) for _ in range(passes)]
    log(f"{spec.name}: raw s3fs, {samplers} readers: {[round(r['mb_per_s']) for r in raws]} MB/s")
    ing = ingest_run(spec, truth, s3, root, samplers, spy)
    log(f"{spec.name}: daemon: /healthz {ing['healthz_s']:.1f}s, all samples at {ing['done_s']:.1f}s: "
        f"{ing['mb_per_s']:.0f} MB/s after /healthz, steady {ing.get('steady_mb_per_s', 0):.0f} MB/s, "
        f"verified {ing['verified']}")
    after = raw_pass(opts, truth["ranges"], samplers)
    log(f"{spec.name}: raw s3fs after the daemon: {after['mb_per_s']:.0f} MB/s")
    raw_all = raws + [after]
    raw_mb = statistics.median(r["mb_per_s"] for r in raw_all)
    raw_cpu = statistics.median(r["cpu_ms_per_mb"] for r in raw_all)
    cores = len(os.sched_getaffinity(0))
    # on this machine the server, the raw readers, the samplers and the daemon share the same cores: the
    # ingest can go no faster than all of them busy at the pipeline's machine-wide CPU cost per MB
    res["cpu"] = {"raw_ms_per_mb": raw_cpu, "ingest_ms_per_mb": ing["cpu_ms_per_mb"], "cores": cores,
                  "raw_cores_busy": statistics.median(r["cores_busy"] for r in raw_all),
                  "ingest_cores_busy": ing["cores_busy"],
                  "ratio_ceiling": (1000 * cores / ing["cpu_ms_per_mb"]) / raw_mb}
    log(f"{spec.name}: machine CPU per MB: raw read {raw_cpu:.2f} ms (cores busy "
        f"{res['cpu']['raw_cores_busy']:.2f}), daemon ingest {ing['cpu_ms_per_mb']:.2f} ms (cores busy "
        f"{ing['cores_busy']:.2f}); with every core busy the ingest could reach {res['cpu']['ratio_ceiling']:.2f}x raw")
    res.update(raw=raws, raw_after=after, raw_mb_per_s=raw_mb, ingest=ing,
               ratio=ing["mb_per_s"] / raw_mb, ratio_steady=(ing.get("steady_mb_per_s") or 0) / raw_mb,
               ratio_total=ing["mb_per_s_total"] / raw_mb)
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        res["stages"] = stage_profile(spec, truth, s3, Path(scratch), profile_units)
        log(f"{spec.name}: one process, stage by stage: " + ", ".join(
            f"{k} {v['share'] * 100:.0f}%" for k, v in res["stages"]["stages"].items()))
        if variants:
            res["variants"] = read_variants(truth, s3, profile_units)
        res["cprofile"] = cprofile_unit(truth, s3, Path(scratch))
    res["verified"] = ing["verified"]
    return res


def report(results: dict[str, Any], samplers: int) -> str:
    lines = [f"ingest: S3 (SeaweedFS on loopback) -> LMDB, {samplers} samplers vs {samplers} raw s3fs readers; "
             f"MB = 1e6 B of Parquet row groups", "",
             f"{'dataset':<7} {'rows':>9} {'MB':>7} {'raw MB/s':>9} {'start s':>8} {'1st s':>6} {'ingest s':>9} "
             f"{'MB/s':>7} {'x raw':>6} {'steady':>7} {'x raw':>6} {'LMDB MB/s':>10}  verified"]
    for name, r in results.items():
        i = r["ingest"]
        lines.append(f"{name:<7} {r['truth']['samples']:>9,} {r['truth']['row_group_bytes'] / MB:>7,.0f} "
                     f"{r['raw_mb_per_s']:>9,.0f} {i['healthz_s']:>8.1f} {fmt(i['first_shard_s'], '.1f'):>6} "
                     f"{i['ingest_s']:>9.1f} {i['mb_per_s']:>7,.0f} "
                     f"{r['ratio']:>6.2f} {i.get('steady_mb_per_s', 0):>7,.0f} {r['ratio_steady']:>6.2f} "
                     f"{i['lmdb_mb_per_s']:>10,.0f}  {'yes' if r['verified'] else 'NO'}")
    lines.append("")
    lines.append(f"{'dataset':<7} {'raw CPU ms/MB':>14} {'cores busy':>11} {'ingest CPU ms/MB':>17} {'cores busy':>11} "
                 f"{'x raw ceiling':>14}")
    for name, r in results.items():
        c = r["cpu"]
        lines.append(f"{name:<7} {c['raw_ms_per_mb']:>14.2f} {c['raw_cores_busy']:>11.2f} {c['ingest_ms_per_mb']:>17.2f} "
                     f"{c['ingest_cores_busy']:>11.2f} {c['ratio_ceiling']:>14.2f}")
    lines += ["CPU = the whole machine's busy core-time per MB (S3 server, readers/samplers, daemon); 'x raw "
              "ceiling' = the ingest rate with every core busy at its CPU cost, over the raw read rate", ""]
    lines += ["target: x raw >= 0.80. 'start s' = process start -> /healthz (imports, discovery; excluded from "
              "MB/s); '1st s' = process start -> first shard resident (samplers spawned and warmed up: included); "
              "'steady' = over the span of the shards' commit stamps; LMDB MB/s = encoded payload after /healthz", ""]
    for name, r in results.items():
        st = r["stages"]
        lines.append(f"{name}: where a sampler's time goes (this process, {st['units']} units, "
                     f"{st['mb_per_s_one_process']:.0f} MB/s end to end, ingest included)")
        for k, v in st["stages"].items():
            lines.append(f"  {k:<16} {v['seconds']:>7.2f} s {100 * v['share']:>5.1f} %   "
                         f"{fmt(v['mb_per_s'], ',.0f'):>7} MB/s alone")
        if "variants" in r:
            lines.append(f"  read step alone, variants ({r['variants']['units']} units, best of 2):")
            for row in r["variants"]["rows"]:
                lines.append(f"    {row['variant']:<40} {row['mb_per_s']:>7,.0f} MB/s")
        if "py_spy" in r["ingest"]:
            ps = r["ingest"]["py_spy"]
            lines.append(f"  py-spy during the ingest: {ps['samples']} busy samples, {ps['by_process']}; "
                         f"top self time (% of all busy samples):")
            for kind in ("sampler", "daemon"):
                for frame, c in ps["self"][kind][:8]:
                    lines.append(f"    {kind:<7} {100 * c / max(1, ps['samples']):5.1f} %  {frame[:100]}")
        lines.append("")
    return "\n".join(lines)


def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--large-mb", type=float, default=None, help="MB of LARGE rows (default 200; --quick 25)")
    p.add_argument("--small-mb", type=float, default=None, help="MB of SMALL rows (default 200; --quick 10)")
    p.add_argument("--samplers", type=int, default=2, help="daemon samplers = raw readers (default 2)")
    p.add_argument("--passes", type=int, default=None, help="timed raw passes (default 2; --quick 1)")
    p.add_argument("--profile-units", type=int, default=None, help="units in the stage profile (default 6; --quick 2)")
    p.add_argument("--no-variants", action="store_true", help="skip the read variants")
    p.add_argument("--py-spy", action="store_true", help="sample the daemon and its samplers with py-spy")
    p.add_argument("--datasets", default="large,small", help="comma-separated subset of large,small")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    p.add_argument("--workdir", type=Path, default=Path("bench-data") / "ingest",
                   help="S3 server data, caches, logs (default ./bench-data/ingest; the S3 data is removed after)")
    a = p.parse_args(argv)
    quick = a.quick
    specs = make_specs(a.large_mb if a.large_mb is not None else (25 if quick else 200),
                       a.small_mb if a.small_mb is not None else (10 if quick else 200), quick)
    names = [n.strip() for n in a.datasets.split(",") if n.strip()]
    if not names or any(n not in specs for n in names):
        p.error(f"--datasets takes a comma-separated subset of {sorted(specs)}")
    passes = a.passes if a.passes is not None else (1 if quick else 2)
    units = a.profile_units if a.profile_units is not None else (2 if quick else 6)
    if a.samplers < 1 or passes < 1 or units < 1:
        p.error("--samplers, --passes and --profile-units must be >= 1")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the S3 server and the daemon are stopped
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    root = a.workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    s3_dir = Path(tempfile.mkdtemp(prefix="s3-", dir=root))
    results: dict[str, Any] = {}
    try:
        with S3Server(s3_dir, "seaweedfs") as s3:
            s3.make_bucket(BUCKET)
            log(f"S3 server {s3.endpoint} up in {s3.startup_seconds:.1f}s")
            for name in names:
                results[name] = run_dataset(specs[name], s3, root, a.samplers, passes, a.py_spy, units,
                                            not a.no_variants)
    finally:
        shutil.rmtree(s3_dir, ignore_errors=True)
    out = {"benchmark": "ingest", "bench_format": BENCH_FORMAT, "quick": quick, "samplers": a.samplers,
           "seconds": time.perf_counter() - t0, "datasets": results,
           "host": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                    "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "pyarrow": pa.__version__}}
    out["verified"] = all(r["verified"] for r in results.values())
    print()
    print(report(results, a.samplers))
    for name, r in results.items():
        print(f"--- {name}: cProfile of run_task on one unit (tottime)")
        print("\n".join(r["cprofile"].splitlines()[:30]))
    print(f"load average {load_start[0]:.2f} -> {out['host']['loadavg_end'][0]:.2f} on {os.cpu_count()} cores: "
          f"numbers are noisy on a shared machine")
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2, default=str))
    return 0 if out["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
