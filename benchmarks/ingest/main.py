"""Ingest rate and cost: S3 server -> LMDB against a raw s3fs read of the same bytes, in one run.

    python -m benchmarks.ingest [--large-mb 200] [--small-mb 200] [--samplers 2] [--passes 2]
                                [--scaling auto|none|1,2,4] [--oversubscribe] [--json out.json] [--quick]
                                [--workdir DIR] [--py-spy] [--no-variants] [--datasets large,small]
                                [--rolling SECONDS]

Targets (issue 14): ingest CPU per MB <= 1.5x the raw read's, for both row sizes; read amplification <= 1.1x;
the ingest rate for 1, 2, 4, ... samplers, and where it stops scaling and why.

A real S3 server (SeaweedFS) runs on loopback; two datasets are uploaded (``benchmarks/ingest/data.py``: LARGE
1 MiB rows, SMALL 256 B rows). For each:

a. raw (``ingest_raw.py``): every row group's byte range read by ``--samplers`` s3fs reader processes: one
   untimed warm-up pass, ``--passes`` timed ones, and one more after the daemon ran (median of all);
b. the daemon (``ingest_daemon.py``) on a fresh cache with ``--samplers``, until every sample is resident; the
   sealed epoch 0 read back from LMDB (count and sum of ``y``) is the verification;
c. CPU per MB both ways (``ingest_cpu.py``): the machine's busy time, and that of exactly the processes
   involved (the S3 server's tree + the readers over their reads; the S3 server's tree + the daemon's tree from
   /healthz to the last sample, less the samplers' start-up measured apart, as the readers' is left out), and
   the ratio ingest / raw; read amplification from ``/v1/status``'s ``remote.bytes_read`` over the column-chunk
   bytes (and the daemon's own ``remote.read_amplification``);
d. scaling (``ingest_scaling.py``): b. and a. again for every other sampler count of ``--scaling``, and where
   the rate stops scaling and why (cores saturated, by this run or by other work; daemon-bound; server-bound);
e. the steady state (``ingest_rolling.py``, ``--rolling`` seconds): the daemon with a budget of half the data and
   ``--pacing off``, CPU per MB over a window once the full cache evicts as it ingests (the regime of a training
   host after its first epochs), against the same raw read; and the page-cache tax of this machine (the kernel
   CPU of writing into pages the guest has not touched lately, which a growing cache pays and a full one not);
f. where a sampler's time goes (``ingest_stages.py``): a stage profile, read variants and a cProfile.

MB = 10**6 bytes (of Parquet column chunks). The exit code is 1 when any verification failed; without s3fs or
the ``weed`` binary the run says which and how to install it and measures nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..harness import (
    MB,
    Missing,
    Spec,
    common,
    host,
    load_note,
    loadavg,
    log,
    missing,
    parser,
    s3_server,
    s3fs_options,
    subset,
    write_report,
)
from .cpu import startup_cpu_s
from .daemon import ingest_run
from .data import BUCKET, make_specs, part_truth, upload_truth
from .raw import raw_series
from .report import AMP_TARGET, CPU_TARGET, report
from .rolling import page_cache_tax, rolling_run
from .scaling import parse_counts, run_scaling
from .stages import cprofile_unit, guarded, read_variants, stage_profile


def cpu_summary(raws: list[dict[str, Any]], ing: dict[str, Any], probe: dict[str, Any]) -> dict[str, Any]:
    """CPU ms per MB of the raw read (median of its passes) and of the ingest, both ways, and their ratio."""
    mb = ing["cpu"]["mb"]
    used = ing["cpu_s"]
    machine = {"raw_ms_per_mb": statistics.median(r["cpu_ms_per_mb"] for r in raws),
               "ingest_ms_per_mb": ing["cpu_ms_per_mb"]}
    procs = {"raw_ms_per_mb": statistics.median(r["proc_cpu_ms_per_mb"] for r in raws),
             "ingest_ms_per_mb": ing["proc_cpu_ms_per_mb"],
             "raw_server": statistics.median(1000 * r["server_cpu_s"] / (r["bytes"] / MB) for r in raws),
             "raw_readers": statistics.median(1000 * r["readers_cpu_s"] / (r["bytes"] / MB) for r in raws),
             "ingest_server": 1000 * used["server"] / mb, "ingest_daemon": 1000 * used["daemon_main"] / mb,
             "ingest_samplers": 1000 * used["samplers"] / mb}
    for c in (machine, procs):
        c["ratio"] = c["ingest_ms_per_mb"] / c["raw_ms_per_mb"]
        c["target_ok"] = c["ratio"] <= CPU_TARGET
    return {"machine": machine, "processes": procs, "startup_cpu_s": ing["startup_cpu_s"], "probe": probe,
            "incl_start": {"processes_ms_per_mb": ing["incl_start"]["proc_cpu_ms_per_mb"],
                           "machine_ms_per_mb": ing["incl_start"]["cpu_ms_per_mb"]},
            "cores": len(os.sched_getaffinity(0))}


def marginal(full: dict[str, Any], part: dict[str, Any], cpu: dict[str, Any]) -> dict[str, Any]:
    """CPU per MB of the bytes the full run ingested beyond the part run (the first half of the files), both
    with the start-up: it is the same in both and cancels, without being measured."""
    if not part["verified"]:
        return {"error": f"the part run was not verified: {part['check']}"}
    mb = full["mb"] - part["mb"]
    a, b = full["incl_start"]["cpu_s"], part["incl_start"]["cpu_s"]
    procs = (a["server"] + a["daemon_tree"] - b["server"] - b["daemon_tree"]) * 1000 / mb
    machine = (a["machine"] - b["machine"]) * 1000 / mb
    return {"mb": mb, "part_mb": part["mb"], "processes_ms_per_mb": procs, "machine_ms_per_mb": machine,
            "processes_ratio": procs / cpu["processes"]["raw_ms_per_mb"],
            "machine_ratio": machine / cpu["machine"]["raw_ms_per_mb"]}


def run_dataset(spec: Spec, s3: Any, root: Path, a: argparse.Namespace, counts: list[int]) -> dict[str, Any]:
    truth = upload_truth(spec, s3.fs())
    opts = s3fs_options(s3)
    res: dict[str, Any] = {"spec": asdict(spec), "truth": {k: v for k, v in truth.items() if k != "ranges"}}
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        probe = startup_cpu_s(truth["url"], truth["ranges"][0], Path(scratch), s3.env(), runs=1 if a.quick else 3)
    startup = probe["seconds"]
    log(f"{spec.name}: a sampler's start-up: {startup:.2f} CPU s ({probe['how']}; left out of the ingest's CPU)")
    raws = raw_series(opts, truth["ranges"], a.samplers, s3.pid, a.passes)
    log(f"{spec.name}: raw s3fs, {a.samplers} readers: {[round(r['mb_per_s']) for r in raws]} MB/s")
    dec = raw_series(opts, truth["ranges"], a.samplers, s3.pid, 1, decode=True)[0]
    log(f"{spec.name}: fetch + decode, {a.samplers} readers: {dec['mb_per_s']:.0f} MB/s, "
        f"{dec['proc_cpu_ms_per_mb']:.2f} ms/MB")
    ing = ingest_run(spec, truth, s3, root, a.samplers, a.py_spy, startup)
    log(f"{spec.name}: daemon: /healthz {ing['healthz_s']:.1f}s, all samples at {ing['done_s']:.1f}s: "
        f"{ing['mb_per_s']:.0f} MB/s after /healthz, verified {ing['verified']}, "
        f"read amplification {ing['amplification']['ratio']:.3f}")
    after = raw_series(opts, truth["ranges"], a.samplers, s3.pid, 1)[0]
    raw_all = raws + [after]
    res.update(raw=raws, raw_after=after, raw_mb_per_s=statistics.median(r["mb_per_s"] for r in raw_all),
               ingest=ing, cpu=cpu_summary(raw_all, ing, probe))
    res["cpu"]["decode"] = {"processes_ms_per_mb": dec["proc_cpu_ms_per_mb"], "machine_ms_per_mb": dec["cpu_ms_per_mb"],
                            "mb_per_s": dec["mb_per_s"], "server": 1000 * dec["server_cpu_s"] / (dec["bytes"] / MB),
                            "readers": 1000 * dec["readers_cpu_s"] / (dec["bytes"] / MB)}
    res["ratio"] = ing["mb_per_s"] / res["raw_mb_per_s"]
    part = part_truth(truth, s3.fs()) if a.differential else None
    if part is not None:
        res["cpu"]["marginal"] = marginal(ing, ingest_run(spec, part, s3, root, a.samplers, False, startup), res["cpu"])
    c = res["cpu"]
    log(f"{spec.name}: CPU ms/MB raw -> ingest: processes {c['processes']['raw_ms_per_mb']:.2f} -> "
        f"{c['processes']['ingest_ms_per_mb']:.2f} ({c['processes']['ratio']:.2f}x), machine "
        f"{c['machine']['raw_ms_per_mb']:.2f} -> {c['machine']['ingest_ms_per_mb']:.2f} ({c['machine']['ratio']:.2f}x)")
    verified = ing["verified"]
    if counts:
        def measure(n: int) -> tuple[dict[str, Any], dict[str, Any]]:
            raw = raw_series(opts, truth["ranges"], n, s3.pid, 1)[0]
            run = ingest_run(spec, truth, s3, root, n, False, startup)
            log(f"{spec.name}: {n} samplers: {run['mb_per_s']:.0f} MB/s (raw {raw['mb_per_s']:.0f}), "
                f"{run['proc_cpu_ms_per_mb']:.2f} ms/MB, cores busy {run['cores_busy']:.2f}")
            return raw, run
        res["scaling"] = run_scaling(counts, {a.samplers: (after, ing)}, measure)
        verified = verified and all(w["verified"] for w in res["scaling"]["rows"])
        log(f"{spec.name}: {res['scaling']['verdict']}")
    if a.rolling > 0:
        roll = res["rolling"] = guarded(rolling_run, spec, truth, s3, root, a.samplers, a.rolling, startup,
                                               ing["status"]["bytes"])
        if "error" not in roll:
            roll["ratio"] = roll["proc_cpu_ms_per_mb"] / res["cpu"]["processes"]["raw_ms_per_mb"]
            roll["machine_ratio"] = roll["cpu_ms_per_mb"] / res["cpu"]["machine"]["raw_ms_per_mb"]
            roll["target_ok"] = roll["ratio"] <= CPU_TARGET
            roll["decode_ratio"] = roll["proc_cpu_ms_per_mb"] / res["cpu"]["decode"]["processes_ms_per_mb"]
            log(f"{spec.name}: steady state (full cache, rolling): {roll['proc_cpu_ms_per_mb']:.2f} ms/MB = "
                f"{roll['ratio']:.2f}x raw, {roll['mb_per_s']:.0f} MB/s over {roll['seconds']:.0f} s")
        else:
            log(f"{spec.name}: steady state not measured: {roll['error']}")
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        res["stages"] = guarded(stage_profile, truth, s3, Path(scratch), a.profile_units)
        if not a.no_variants:
            res["variants"] = guarded(read_variants, truth, s3, a.profile_units)
        res["cprofile"] = guarded(cprofile_unit, truth, s3, Path(scratch))
    res["verified"] = verified
    return res


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, Spec], list[int]]:
    p = parser(__doc__)
    p.prog = "python -m benchmarks.ingest"
    common(p, workdir=Path("bench-data") / "ingest")
    p.add_argument("--large-mb", type=float, default=None, help="MB of LARGE rows in Parquet (default 200; --quick 25)")
    p.add_argument("--small-mb", type=float, default=None, help="MB of SMALL rows in Parquet (default 200; --quick 12)")
    p.add_argument("--samplers", type=int, default=2, help="daemon samplers = raw readers (default 2)")
    p.add_argument("--passes", type=int, default=None, help="timed raw passes (default 2; --quick 1)")
    p.add_argument("--scaling", default="auto",
                   help="sampler counts to scale over: 'auto' (1, 2, 4, ... up to the cores), 'none' or '1,2,4,8,16'")
    p.add_argument("--oversubscribe", action="store_true", help="allow --scaling counts above the cores")
    p.add_argument("--differential", action=argparse.BooleanOptionalAction, default=None,
                   help="also ingest the first half of the files: the CPU per MB of the difference, where the "
                        "start-up cancels (default on; --quick off)")
    p.add_argument("--profile-units", type=int, default=None, help="units in the stage profile (default 6; --quick 2)")
    p.add_argument("--no-variants", action="store_true", help="skip the read variants")
    p.add_argument("--py-spy", action="store_true", help="sample the daemon and its samplers with py-spy")
    p.add_argument("--datasets", default="large,small", help="comma-separated subset of large,small")
    p.add_argument("--rolling", type=float, default=None,
                   help="seconds of the steady-state window (a full cache evicting as it ingests; default 10, "
                        "--quick 0 = not run); its budget holds 17 row groups, which must be under 90%% of the dataset "
                        "(--large-mb 600, --small-mb 800)")
    a = p.parse_args(argv)
    specs = make_specs(a.large_mb if a.large_mb is not None else (25 if a.quick else 200),
                       a.small_mb if a.small_mb is not None else (12 if a.quick else 200), a.quick)
    names = subset(p, "--datasets", a.datasets, list(specs))
    a.rolling = a.rolling if a.rolling is not None else (0.0 if a.quick else 10.0)
    a.passes = a.passes if a.passes is not None else (1 if a.quick else 2)
    a.differential = (not a.quick) if a.differential is None else a.differential
    a.profile_units = a.profile_units if a.profile_units is not None else (2 if a.quick else 6)
    if a.samplers < 1 or a.passes < 1 or a.profile_units < 1:
        p.error("--samplers, --passes and --profile-units must be >= 1")
    try:
        counts = parse_counts(a.scaling, a.oversubscribe)
    except ValueError as e:
        p.error(str(e))
    return a, {n: specs[n] for n in names}, counts


def main(argv: list[str] | None = None) -> int:
    a, specs, counts = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the S3 server and the daemon are stopped
    t0, load_start = time.perf_counter(), loadavg()
    root = a.workdir.resolve()
    out: dict[str, Any] = {"benchmark": "ingest", "quick": a.quick, "samplers": a.samplers, "scaling": counts,
                           "targets": {"cpu_ratio": CPU_TARGET, "read_amplification": AMP_TARGET}, "missing": {}}
    if a.py_spy and missing("py-spy"):
        out["missing"]["py-spy"] = missing("py-spy")
        log(f"--py-spy: py-spy {missing('py-spy')}; the rest runs without it")
    results: dict[str, Any] = {}
    try:
        with s3_server(root) as s3:
            s3.make_bucket(BUCKET)
            log(f"S3 server {s3.endpoint} up in {s3.startup_seconds:.1f}s")
            for name, spec in specs.items():
                results[name] = run_dataset(spec, s3, root, a, counts)
            if a.rolling > 0:
                out["page_cache_tax"] = guarded(page_cache_tax, root / "tax")
    except Missing as e:  # s3fs or the weed binary: nothing here can run without them
        log(f"cannot run: {e}")
        out["missing"]["s3"] = str(e)
    out.update(seconds=time.perf_counter() - t0, datasets=results, host=host(load_start),
               verified=bool(results) and all(r["verified"] for r in results.values()))
    print()
    print(report(results, a.samplers, out.get("page_cache_tax")))
    for name, r in results.items():
        text = r["cprofile"] if isinstance(r["cprofile"], str) else f"not taken: {r['cprofile']['error']}"
        print(f"--- {name}: cProfile of run_task on one unit (tottime)")
        print("\n".join(text.splitlines()[:30]))
    for key, why in out["missing"].items():
        print(f"missing: {key}: {why}")
    print(load_note(load_start) + " (the processes' CPU per MB much less so than wall-clock figures)")
    write_report(a.json, out)
    return 0 if all(r["verified"] for r in results.values()) else 1  # a missing tool is reported, not failed
