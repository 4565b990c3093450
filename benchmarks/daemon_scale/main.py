"""The daemon at scale: a 10M-sample manifest to 64 concurrent clients, its RSS, and read rate vs cache size.

    python -m benchmarks.daemon_scale [--shards 100000] [--rows 100] [--clients 64] [--requests 10]
                                      [--read-sizes 1GiB,4GiB] [--json out.json] [--quick] [--workdir DIR]

Targets (from the issue):

* a manifest of 10M samples in 100k shards served with p99 <= 50 ms to 64 concurrent clients;
* daemon RSS <= 300 MB at 10M samples;
* read rate flat (within 10%) from a 1 GB to a 16 GB cache.

Caches are built WITHOUT the remote and without a daemon (``benchmarks.daemon_scale.cache``): the benchmark opens the
LMDB environment with ``samplecache_service.store.writer.open_env``, builds a ``Catalog``
and a ``Writer`` in-process and submits write transactions of many shards each
(``--per-txn``, default 1000): every block encoded with ``samplecache.format.blockenc.encode_block``
under a schema from ``samplecache_service.sampling.encoder.infer_schema``, shard JSON from
``catalog.Shard``, and the meta keys ``format``, ``source``, ``schema``, ``next_shard``
plus a ``files`` entry per source file whose row groups are exactly the cached
shards. The source is a real local Parquet directory of tiny files with the same
Arrow schema (``file://``; the daemon lists it at start and finds no new file), so
the real daemon (``samplecache serve``, via ``samplecache_tools.launch.DaemonProcess``)
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

Part 2, read rate vs cache size (``--read-sizes``; ``benchmarks.daemon_scale.read``): a cache of each size of
16 KiB samples (``x`` = fixed_size_list<uint8, 16384>, 64 samples = one 1 MiB block, 4 blocks per shard)
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

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from samplecache.format.record import BlockView, Schema, shard_prefix

from ..harness import (
    MB,
    cli,
    fmt,
    http_get,
    http_post,
    human,
    log,
    missing,
    missing_report,
    parse_size,
    print_missing,
    report,
    stop_daemon,
)
from .cache import BENCH_FORMAT, CacheSpec, build_cache, clear_epochs, start_idle
from .load import cpu_seconds, load, memory, sequential
from .read import run_read

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
    from samplecache.reading.blocks.reader import open_cache

    schema = Schema.from_json(m["schema"])
    cy = schema.index("y")
    env, db = open_cache(m["lmdb_path"], int(m["map_size"]), m.get("cache_id", ""))
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
    d, startup = start_idle(built["source"], cache, built["max_bytes"])
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
        raw = http_get(d.url + "/v1/epochs/0", timeout=120)
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
        compact = http_get(d.url + "/v1/epochs/0?format=compact", timeout=120)  # what the client fetches
        res["compact_manifest_bytes"] = len(compact)
        res["concurrent_compact"] = load(d.port, path + "?format=compact", clients, k, compact, procs)
        c = res["concurrent_compact"]
        if c["errors"] or c["requests"] != clients * k:
            problems.append(f"compact: {c['errors']} failed/mismatched responses: {c['error_examples']}")
        log(f"scale: compact manifest ({human(len(compact))}), {clients} clients x {k}: p50 "
            f"{c.get('p50_ms', 0):.1f} ms, p99 {c.get('p99_ms', 0):.1f} ms, max {c.get('max_ms', 0):.1f} ms")
        # every rank and DataLoader worker of a job asks which daemon epoch its epoch reads (the first maps it)
        token_file = cache / "api-token"  # the daemon's own, when it authenticates (its default on this host)
        run, token = "5ca1e0000000000d", token_file.read_text().strip() if token_file.exists() else None
        http_post(d.url + "/v1/jobs", {"name": "scale", "run": run}, token)
        job_path = f"/v1/jobs/scale/epochs/0?run={run}"
        mapped = http_post(d.url + job_path, {}, token)
        res["concurrent_map"] = load(d.port, job_path, clients, k, mapped, procs, method="POST", token=token)
        c = res["concurrent_map"]
        if c["errors"] or c["requests"] != clients * k:
            problems.append(f"job epoch map: {c['errors']} failed/mismatched responses: {c['error_examples']}")
        log(f"scale: POST {job_path}, {clients} clients x {k}: p50 {c.get('p50_ms', 0):.1f} ms, p99 "
            f"{c.get('p99_ms', 0):.1f} ms, max {c.get('max_ms', 0):.1f} ms")
        res["memory_after_load"] = memory(pid)
        res["status_after_load"] = sequential(d.url + "/v1/status", 20)
    finally:
        stop_daemon(d)
    res["problems"] = problems
    res["verified"] = not problems
    return res


# --- output -----------------------------------------------------------------------------------------

def summary(res: dict[str, Any]) -> str:
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
            peak = "" if name != "after the load" else f", peak {m['hwm'] / MB:.0f} MB"
            lines.append(f"{'daemon RSS, ' + name:<34} {m['rss'] / MB:>11.0f} MB  <= 300 MB; "
                         f"anon {m['anon'] / MB:.0f} MB, file {m['file'] / MB:.0f} MB{peak}")
        sampler_rss = s["memory_idle"]["sampler_rss"]
        sampler_mb = fmt(max(sampler_rss, default=None) and max(sampler_rss) / MB, ".0f")
        lines += [f"{'sampler process RSS':<34} {sampler_mb:>11} MB  (each, separate)",
                  f"{'daemon CPU while idle':<34} {100 * s['idle_cpu_fraction']:>12.1f} %  of one core",
                  f"{'GET /v1/status p50 / p99 (idle)':<34} {s['status_idle']['p50_ms']:>6.1f} / "
                  f"{s['status_idle']['p99_ms']:<5.1f} ms",
                  "",
                  f"GET /v1/epochs/0 ({s['manifest_bytes'] / MB:.2f} MB each)",
                  f"{'clients':>7} {'requests':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} "
                  f"{'req/s':>7} {'MB/s':>7} {'errors':>6}"]
        rows = [(one, ""), (c, "")] + [(s[k], what) for k, what in (("concurrent_compact", " (compact)"),
                                                                   ("concurrent_map", " (a job's epoch mapped: POST)"))
                                        if k in s]
        for r, what in rows:
            lines.append(f"{r['clients']:>7} {r['requests']:>8} {fmt(r.get('p50_ms'), '.1f'):>8} "
                         f"{fmt(r.get('p95_ms'), '.1f'):>8} {fmt(r.get('p99_ms'), '.1f'):>8} "
                         f"{fmt(r.get('max_ms'), '.1f'):>8} "
                         f"{fmt(r['requests_per_s'], '.1f'):>7} {fmt(r['mb_per_s'], '.0f'):>7} {r['errors']:>6}"
                         f"{what}")
        lines.append("target: p99 <= 50 ms with 64 concurrent clients; the clients run on the same host")
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
    p = cli.parser(__doc__)
    p.prog = "python -m benchmarks.daemon_scale"
    cli.common(p, workdir=cli.BENCH_DATA / "scale", quick="tiny sizes (CI smoke run)")
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
    a = p.parse_args(argv)

    quick = a.quick
    shards = a.shards if a.shards is not None else (2_000 if quick else 100_000)
    files = a.files if a.files is not None else max(1, shards // 1000)
    k = a.requests if a.requests is not None else (3 if quick else 10)
    passes = a.passes if a.passes is not None else (1 if quick else 3)
    sizes_arg = a.read_sizes if a.read_sizes is not None else ("16MiB,64MiB" if quick else "1GiB,4GiB")
    try:
        sizes = [parse_size(x) for x in sizes_arg.split(",") if x.strip()]
    except ValueError as e:
        p.error(f"--read-sizes: {e}")
    if shards < 1 or a.rows < 1 or k < 1 or a.clients < 1 or passes < 1:
        p.error("--shards, --rows, --requests, --clients and --passes must be >= 1")

    t0, load_start = time.perf_counter(), report.loadavg()
    root = a.workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    gone = {"fincore": why} if sizes and (why := missing("fincore")) else {}
    res: dict[str, Any] = {"benchmark": "daemon_scale", "bench_format": BENCH_FORMAT, "quick": quick}
    if not a.no_scale:
        spec = CacheSpec("scale", shards=shards, rows=a.rows, blocks=1, width=8, files=files, per_txn=a.per_txn)
        res["scale"] = run_scale(spec, root / "scale", a.clients, k, a.client_procs)
    if sizes:
        res["read"] = run_read(sizes, root, passes, quick)
    res["seconds"] = time.perf_counter() - t0
    res["host"] = report.host(load_start, ("numpy", "pyarrow"))
    res["missing"] = missing_report(gone)
    res["verified"] = all(res[p]["verified"] for p in ("scale", "read") if p in res)
    print()
    print(summary(res))
    print_missing(gone)
    print("\n" + report.load_note(load_start))
    report.write_report(a.json, res)
    return 0 if res["verified"] else 1
