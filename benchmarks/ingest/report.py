"""The text report of benchmarks/ingest/main.py: rates, CPU per MB both ways against the raw read (target <= 1.5x),
read amplification (target <= 1.1x), scaling, and where a sampler's time goes."""

from __future__ import annotations

from typing import Any

from ..harness import MB

CPU_TARGET, AMP_TARGET = 1.5, 1.1


def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def mark(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def rates(results: dict[str, Any], samplers: int) -> list[str]:
    lines = [f"ingest: S3 (SeaweedFS on loopback) -> LMDB, {samplers} samplers vs {samplers} raw s3fs readers; "
             f"MB = 1e6 B of Parquet row groups", "",
             f"{'dataset':<7} {'rows':>9} {'MB':>7} {'raw MB/s':>9} {'start s':>8} {'1st s':>6} {'ingest s':>9} "
             f"{'MB/s':>7} {'x raw':>6} {'steady':>7} {'LMDB MB/s':>10}  verified"]
    for name, r in results.items():
        i = r["ingest"]
        lines.append(f"{name:<7} {r['truth']['samples']:>9,} {r['truth']['row_group_bytes'] / MB:>7,.0f} "
                     f"{r['raw_mb_per_s']:>9,.0f} {i['healthz_s']:>8.1f} {fmt(i['first_shard_s'], '.1f'):>6} "
                     f"{i['ingest_s']:>9.1f} {i['mb_per_s']:>7,.0f} {r['ratio']:>6.2f} "
                     f"{fmt(i.get('steady_mb_per_s'), ',.0f'):>7} {i['lmdb_mb_per_s']:>10,.0f}  "
                     f"{'yes' if r['verified'] else 'NO'}")
    return lines + ["'start s' = process start -> /healthz (excluded from MB/s); "
                    "'1st s' = process start -> first shard resident; "
                    "'steady' = over the span of the shards' commit stamps", ""]


def cpu(results: dict[str, Any]) -> list[str]:
    lines = [f"CPU ms per MB, target: ingest <= {CPU_TARGET}x the raw read's",
             f"{'dataset':<7} {'measure':<10} {'raw':>7} {'ingest':>7} {'ratio':>6}  target  {'incl. start':>11}  "
             f"{'raw: server + readers':>22}  {'ingest: server + daemon + samplers':>35}"]
    for name, r in results.items():
        for way in ("processes", "machine"):
            c = r["cpu"][way]
            parts = ""
            if way == "processes":
                parts = (f"{c['raw_server']:>10.2f} + {c['raw_readers']:<9.2f}  "
                         f"{c['ingest_server']:>13.2f} + {c['ingest_daemon']:.2f} + {c['ingest_samplers']:.2f}")
            start = r["cpu"]["incl_start"][f"{way}_ms_per_mb"]
            lines.append(f"{name:<7} {way:<10} {c['raw_ms_per_mb']:>7.2f} {c['ingest_ms_per_mb']:>7.2f} "
                         f"{c['ratio']:>6.2f}  {mark(c['target_ok']):<6}  {start:>11.2f}  {parts}")
    for name, r in results.items():
        dec = r["cpu"].get("decode")
        if dec:
            c = r["cpu"]["processes"]
            lines.append(f"{name:<7} fetch + decode (the raw read's readers also decoding each row group with pyarrow, "
                         f"one thread, as a sampler does): {dec['processes_ms_per_mb']:.2f} ms/MB "
                         f"({dec['server']:.2f} + {dec['readers']:.2f}) = "
                         f"{dec['processes_ms_per_mb'] / c['raw_ms_per_mb']:.2f}x raw; the ingest is "
                         f"{c['ingest_ms_per_mb'] / dec['processes_ms_per_mb']:.2f}x it")
    for name, r in results.items():
        m = r["cpu"].get("marginal")
        if m and "error" in m:
            lines.append(f"{name:<7} marginal: {m['error']}")
        elif m:
            lines.append(f"{name:<7} marginal (the run on all files less the run on the first {m['part_mb']:,.0f} MB, "
                         f"start-up included in both): processes {m['processes_ms_per_mb']:.2f} ms/MB = "
                         f"{m['processes_ratio']:.2f}x raw, machine {m['machine_ms_per_mb']:.2f} ms/MB = "
                         f"{m['machine_ratio']:.2f}x raw")
    starts = ", ".join(f"{n} {r['cpu']['startup_cpu_s']['per_sampler']:.2f} s per sampler, "
                       f"{r['cpu']['startup_cpu_s']['after_healthz']:.2f} s after /healthz" for n, r in results.items())
    return lines + ["processes = utime+stime of the S3 server's tree and the raw readers (over their reads), or of "
                    "the S3 server's tree and the daemon's tree (main process + samplers, reaped ones included) from "
                    "/healthz until every sample is resident; machine = /proc/stat busy time of every core (other "
                    "work on the machine included). The samplers' start-up (interpreter, imports, s3fs and its first "
                    "connection: measured in a process that does just that) is left out, as the raw readers' is; "
                    f"'incl. start' keeps it ({starts})", ""]


def amplification(results: dict[str, Any]) -> list[str]:
    lines = [f"read amplification: bytes fetched from S3 (units + footers) per byte of column chunks needed; "
             f"target <= {AMP_TARGET}x",
             f"{'dataset':<7} {'fetched MB':>11} {'needed MB':>10} {'footers MB':>11} {'ratio':>6}  "
             "target  daemon's own"]
    for name, r in results.items():
        a = r["ingest"]["amplification"]
        if a["daemon_ratio"] is None:
            own = "not reported"
        else:
            own = f"{a['daemon_ratio']:.3f} (needed {a['daemon_needed_bytes'] / MB:,.1f} MB)"
        lines.append(f"{name:<7} {a['bytes_read'] / MB:>11,.1f} {a['needed_bytes'] / MB:>10,.1f} "
                     f"{a['footer_bytes'] / MB:>11,.2f} {a['ratio']:>6.3f}  {mark(a['target_ok']):<6}  {own}")
    return lines + [""]


def scaling(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for name, r in results.items():
        sc = r.get("scaling")
        if not sc:
            continue
        lines += [f"{name}: scaling (the daemon on a fresh cache per count; raw = as many s3fs readers)",
                  f"{'samplers':>8} {'raw MB/s':>9} {'raw ms/MB':>10} {'MB/s':>7} {'x raw':>6} {'ms/MB':>7} "
                  f"{'machine':>8} {'cores':>6} {'server':>7} {'daemon':>7} {'thread':>7} {'samplers':>9} "
                  f"{'occupied':>9}  verified"]
        for w in sc["rows"]:
            over = " (oversubscribed)" if w["oversubscribed"] else ""
            lines.append(f"{w['samplers']:>8} {w['raw_mb_per_s']:>9,.0f} {w['raw_proc_cpu_ms_per_mb']:>10.2f} "
                         f"{w['mb_per_s']:>7,.0f} {w['x_raw']:>6.2f} {w['proc_cpu_ms_per_mb']:>7.2f} "
                         f"{w['cpu_ms_per_mb']:>8.2f} {w['cores_busy']:>6.2f} {w['server_cores']:>7.2f} "
                         f"{w['daemon_main_cores']:>7.2f} {w['busiest_thread_cores']:>7.2f} "
                         f"{w['samplers_cores']:>9.2f} "
                         f"{100 * w['sampler_occupancy']:>8.0f}%  {'yes' if w['verified'] else 'NO'}{over}")
        lines += [f"  {sc['verdict']}",
                  "  MB/s and cores from the first shard resident to the last (samplers warm); "
                  "ms/MB = processes' CPU (start-up left out), machine = /proc/stat; cores = machine cores busy; "
                  "server, daemon (main process), thread (its busiest), samplers = cores each kept busy; "
                  "occupied = units in flight / samplers", ""]
    return lines


def rolling(results: dict[str, Any], tax: dict[str, Any] | None) -> list[str]:
    rows = {n: r["rolling"] for n, r in results.items() if "rolling" in r}
    if not rows:
        return []
    lines = [f"steady state: a full cache evicting as it ingests (budget half the data, --pacing off), CPU per MB "
             f"over the window against the same raw read; target <= {CPU_TARGET}x",
             f"{'dataset':<7} {'budget MB':>9} {'window s':>8} {'MB':>6} {'MB/s':>6} {'ms/MB':>6} {'x raw':>6}  "
             f"target  {'machine':>7} {'x raw':>6} {'x f+d':>6}  {'server + daemon + samplers':>27}  "
             f"{'data.mdb MB':>13} {'evicted':>7} {'occupied':>8} {'amplif.':>7}"]
    for name, w in rows.items():
        if "error" in w:
            lines.append(f"{name:<7} not measured: {w['error']}")
            continue
        p, (s0, s1) = w["parts"], w["data_file_mb"]
        lines.append(f"{name:<7} {w['budget'] / MB:>9,.0f} {w['seconds']:>8.1f} {w['mb']:>6,.0f} "
                     f"{w['mb_per_s']:>6,.0f} "
                     f"{w['proc_cpu_ms_per_mb']:>6.2f} {w['ratio']:>6.2f}  {mark(w['target_ok']):<6}  "
                     f"{w['cpu_ms_per_mb']:>7.2f} {w['machine_ratio']:>6.2f} {w.get('decode_ratio', 0):>6.2f}  "
                     f"{p['server']:>9.2f} + {p['daemon_main']:.2f} + {p['samplers']:<7.2f}  "
                     f"{s0:>6,.0f}->{s1:<6,.0f} {w['evicted_shards']:>7,.0f} {100 * w['sampler_occupancy']:>7.0f}% "
                     f"{w['amplification']:>7.3f}")
    lines.append("the window starts once the daemon has ingested 1.5x its budget; MB = column chunks of the units "
                 "sampled in it; x f+d = over the fetch + decode above; amplif. = fetched / needed in the window; "
                 "data.mdb = the LMDB data file at both ends of the window (flat: its pages reused)")
    if tax and "error" in tax:
        lines.append(f"page-cache tax not measured: {tax['error']}")
    elif tax:
        lines.append(f"page-cache tax of this machine: writing {tax['mb']:,.0f} MB into a new file costs "
                     f"{tax['fresh_ms_per_mb']:.2f} kernel ms/MB in pages not touched lately, "
                     f"{tax['reused_ms_per_mb']:.2f} in pages just freed: {tax['tax_ms_per_mb']:.2f} ms/MB more for "
                     f"every MB a growing cache commits (the fill above pays it; the raw read and a full cache not)")
    return lines + [""]


def stages(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for name, r in results.items():
        st = r["stages"]
        if "error" in st:
            lines += [f"{name}: stage profile not taken: {st['error']}", ""]
            continue
        lines.append(f"{name}: where a sampler's time goes (this process, {st['units']} units, "
                     f"{st['mb_per_s_one_process']:.0f} MB/s end to end, ingest included)")
        for k, v in st["stages"].items():
            lines.append(f"  {k:<16} {v['seconds']:>7.2f} s {100 * v['share']:>5.1f} %   "
                         f"{fmt(v['mb_per_s'], ',.0f'):>7} MB/s alone")
        var = r.get("variants")
        if var and "error" in var:
            lines.append(f"  read variants not taken: {var['error']}")
        elif var:
            lines.append(f"  read step alone, variants ({var['units']} units, best of 2):")
            lines += [f"    {row['variant']:<40} {row['mb_per_s']:>7,.0f} MB/s" for row in var["rows"]]
        if "py_spy" in r["ingest"]:
            ps = r["ingest"]["py_spy"]
            lines.append(f"  py-spy during the ingest: {ps['samples']} busy samples, {ps['by_process']}; "
                         f"top self time (% of all busy samples):")
            for kind in ("sampler", "daemon"):
                for frame, c in ps["self"][kind][:8]:
                    lines.append(f"    {kind:<7} {100 * c / max(1, ps['samples']):5.1f} %  {frame[:100]}")
        lines.append("")
    return lines


def report(results: dict[str, Any], samplers: int, tax: dict[str, Any] | None = None) -> str:
    if not results:
        return "ingest: nothing measured (what is missing is said below)"
    return "\n".join(rates(results, samplers) + cpu(results) + amplification(results) + scaling(results)
                     + rolling(results, tax) + stages(results))
