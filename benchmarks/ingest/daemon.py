"""(b) The daemon: ``samplecache serve --source s3://... --samplers N`` on a fresh cache, timed from the process
start until ``/v1/status`` reports every sample resident; the sealed epoch 0 read back from LMDB (count and sum
of ``y``) as the verification.

Start-up (process start -> ``/healthz``: imports, footer discovery, sampler spawn) is reported apart; rates and
CPU are over the time after ``/healthz``. CPU both ways: the machine's busy time, and that of the S3 server's
tree plus the daemon's tree (its main process, every thread, and every sampler, live or reaped) taken before the
daemon stops, less the samplers' start-up (measured apart: ``ingest_cpu.startup_cpu_s``). Read amplification:
``remote.bytes_read`` (samplers and footers) over the column-chunk bytes of every row group; the daemon's own
``remote.needed_bytes`` / ``remote.read_amplification`` where it has them."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from samplecache_tools.launch import DaemonProcess

from ..harness import MB, Spec, all_shards, fetch_epoch, find_tool, http_json, lmdb_check, start_daemon, stop_daemon
from .cpu import Snapshot, spent
from .spy import summarize_raw_profile

POLL = 0.25  # /v1/status is not free for the daemon: polled 4 times a second, the times come from the shards


def _wait_all(d: DaemonProcess, name: str, samples: int, budget: float, t0: float, s3_pid: int) -> dict[str, Any]:
    """Poll /v1/status until every sample is resident; the last status, the CPU clocks when the first shard
    was seen (the samplers warm) and the samplers' mean occupancy (units in flight / processes: below 1 the
    daemon does not keep its samplers busy)."""
    busy, warm = [], None
    while True:
        st = http_json(d.url + "/v1/status")
        now = time.monotonic() - t0
        if st["quarantined"]:
            raise RuntimeError(f"quarantined: {st['quarantined']}")
        if warm is None and 0 < st["samples"] < samples and d.proc is not None:
            warm = Snapshot.take(s3_pid, d.proc.pid)
        procs = st["sampler"]["processes"] or 1
        busy.append(min(1.0, st["sampler"]["in_flight"] / procs))
        if st["samples"] >= samples:
            return {"sampler_occupancy": sum(busy) / len(busy), "status": st, "warm": warm}
        if d.proc is not None and d.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {d.proc.returncode}:\n{d.log_tail()}")
        if now > budget:
            raise TimeoutError(f"{name}: {st['samples']} of {samples} after {now:.0f}s "
                               f"({st['last_error']})\n{d.log_tail()}")
        time.sleep(POLL)


def ingest_run(spec: Spec, truth: dict[str, Any], s3: Any, root: Path, samplers: int, spy: bool,
               startup_s: float) -> dict[str, Any]:
    """One ingest of ``spec`` by the daemon with ``samplers``; ``startup_s``: one sampler's start-up CPU
    (``ingest_cpu.startup_cpu_s``), left out of the ingest's CPU."""
    tag = f"{spec.name}-{samplers}{truth.get('tag', '')}"
    cache = root / f"cache-{tag}"
    if cache.exists():
        shutil.rmtree(cache)
    max_bytes = 3 * truth["row_group_bytes"] + (1 << 30)
    res: dict[str, Any] = {"samplers": samplers}
    spy_proc, prof = None, root / f"py-spy-{spec.name}.txt"
    t0, t0_wall = time.monotonic(), time.time()
    d = start_daemon(truth.get("source", truth["url"] + "/"), cache, samplers=samplers, max_bytes=max_bytes,
                     env=s3.env(), ready=False, log_path=root / f"daemon-{tag}.log", log_level="info")
    try:
        d.wait_ready(timeout=300)
        res["healthz_s"] = time.time() - t0_wall
        assert d.proc is not None
        snap0 = Snapshot.take(s3.pid, d.proc.pid)
        if spy and find_tool("py-spy"):
            spy_proc = subprocess.Popen([str(find_tool("py-spy")), "record", "--pid", str(d.proc.pid), "--subprocesses",
                                         "-r", "97", "-f", "raw", "-o", str(prof), "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        waited = _wait_all(d, spec.name, truth["samples"], 300 + truth["row_group_bytes"] / 2e6, t0, s3.pid)
        snap2 = Snapshot.take(s3.pid, d.proc.pid)
        st, warm = waited.pop("status"), waited.pop("warm")
        res.update(waited)
        if spy_proc is not None:
            spy_proc.send_signal(signal.SIGINT)
            try:
                spy_proc.wait(60)
            except subprocess.TimeoutExpired:
                spy_proc.kill()
            if prof.exists():
                res["py_spy"] = summarize_raw_profile(prof)
            spy_proc = None
        res["status"] = {k: st[k] for k in ("samples", "shards", "bytes", "ingest", "lmdb", "remote", "sampler")}
        res["remote_errors"] = st["remote_errors"]
        created = sorted(s["created"] for s in all_shards(d))
        manifest = fetch_epoch(d, 0)
    finally:
        if spy_proc is not None:
            spy_proc.kill()
        stop_daemon(d)
    n, ysum = lmdb_check(manifest, release=True)
    shutil.rmtree(cache, ignore_errors=True)
    res["verified"] = n == truth["samples"] and ysum == truth["y_sum"] and manifest["samples"] == truth["samples"]
    res["check"] = {"samples": n, "y_sum": ysum, "expected_samples": truth["samples"], "expected_y_sum": truth["y_sum"]}
    # when the first and the last shard were committed (the daemon's clock), not when the poll saw them
    res["first_shard_s"], res["done_s"] = created[0] - t0_wall, created[-1] - t0_wall
    ingest_s = res["done_s"] - res["healthz_s"]
    mb = truth["row_group_bytes"] / MB
    res.update(ingest_s=ingest_s, mb=mb, mb_per_s=mb / ingest_s, mb_per_s_total=mb / res["done_s"],
               lmdb_mb_per_s=st["bytes"] / MB / ingest_s, shards=len(created))
    used = spent(snap0, snap2)
    assert snap0.daemon is not None
    # the samplers' start-up, as far as it fell after /healthz (they are spawned before it), is not ingest;
    # a sampler that never got a unit had no first unit's first-use costs (counted as if it had: a little less)
    spawned = min(samplers + int(st["sampler"]["restarts"]), truth["row_groups"])
    startup = min(used["samplers"], max(0.0, spawned * startup_s - snap0.daemon["descendants"]))
    res["startup_cpu_s"] = {"per_sampler": startup_s, "spawned": spawned, "after_healthz": startup}
    window = snap2.at - snap0.at  # the CPU's window: /healthz until the poll saw every sample
    res["incl_start"] = cpu_window(used, mb, window)
    net = dict(used, samplers=used["samplers"] - startup, daemon_tree=used["daemon_tree"] - startup,
               machine=used["machine"] - startup)
    res["cpu"] = cpu_window(net, mb, window)
    for k in ("cpu_ms_per_mb", "cores_busy", "proc_cpu_ms_per_mb", "proc_cores_busy", "cores", "cpu_s"):
        res[k] = res["cpu"][k]
    # the rate once the first shard is resident (the samplers warm): n-1 shards' worth of bytes arrived over the
    # span between the first and the last commit (for scaling: without the start-up's latency)
    span = created[-1] - created[0]
    res["steady_mb_per_s"] = mb * (len(created) - 1) / len(created) / span if len(created) > 1 and span > 0 else None
    res["warm_mb_per_s"] = res["steady_mb_per_s"] or res["mb_per_s"]
    # cores kept busy once the samplers are warm (first shard seen -> every sample seen), for scaling
    w = spent(warm, snap2) if warm is not None and snap2.at > warm.at else None
    res["warm_cores"] = {k: v / (snap2.at - warm.at) for k, v in w.items()} if w and warm else res["cpu"]["cores"]
    res["amplification"] = amplification(st["remote"], truth)
    return res


def cpu_window(used: dict[str, float], mb: float, seconds: float) -> dict[str, Any]:
    """CPU per MB and cores busy over one window of the ingest (``mb`` ingested, ``seconds`` long)."""
    procs = used["server"] + used["daemon_tree"]
    return {"mb": mb, "seconds": seconds, "mb_per_s": mb / seconds, "cpu_s": used,
            "cpu_ms_per_mb": 1000 * used["machine"] / mb, "cores_busy": used["machine"] / seconds,
            "proc_cpu_ms_per_mb": 1000 * procs / mb, "proc_cores_busy": procs / seconds,
            "cores": {k: v / seconds for k, v in used.items()}}


def amplification(remote: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """Bytes fetched from the remote (units and footers) per byte of column chunks the units needed: computed
    here from the truth, and the daemon's own figure where its status has one."""
    got = int(remote["bytes_read"])
    out = {"bytes_read": got, "needed_bytes": truth["needed_bytes"], "footer_bytes": truth["footer_bytes"],
           "ratio": got / truth["needed_bytes"], "daemon_needed_bytes": remote.get("needed_bytes"),
           "daemon_ratio": remote.get("read_amplification")}
    out["target_ok"] = out["ratio"] <= 1.1
    return out
