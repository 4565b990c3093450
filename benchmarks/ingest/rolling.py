"""(e) The steady state: the daemon with a budget below the dataset and ``--pacing off``, so that once the cache is
full every new shard evicts old ones, as on a training host after its first epochs. The CPU per MB is taken
over a window that starts once the cache has taken in 1.5x its budget (evicting for a while: LMDB's data file
has stopped growing and reuses the pages it frees) and lasts ``seconds``; MB are the column chunks of the units
sampled in the window (``remote.needed_bytes``: the raw read's MB). The LMDB data file's size at both ends of the
window shows whether it still grew.

Why it differs from the fill (b): a growing cache takes new page-cache pages for every MB it commits, and on a
VM whose hypervisor takes freed guest memory back (virtio-balloon free page reporting) a page the guest has not
touched lately costs a host fault on first write. ``page_cache_tax`` measures that in the same run: the kernel
CPU per MB of writing a new file into memory not touched lately, then of writing one more into the pages just
freed. On a machine without it both are the page-cache copy alone (about 0.3 ms/MB).
"""

from __future__ import annotations

import os
import resource
import shutil
import time
from pathlib import Path
from typing import Any

from ..harness import MB, Spec, http_get, http_json, start_daemon, stop_daemon
from .cpu import Snapshot, spent
from .daemon import cpu_window

FILL = 1.5        # the window starts once the daemon has ingested this many budgets' worth
POLL = 0.25
TAX_MB = 256      # per write in page_cache_tax
IDLE_S = 12.0     # a freed page stays with the guest at least this long before it is reported (a few seconds)


def budget_for(truth: dict[str, Any], cached_bytes: int) -> int:
    """Half of what the whole dataset takes in the cache (``cached_bytes``, as the fill (b) stored it), but at
    least 17 row groups as Parquet sizes them (a sampler reads a row group whole when its decoded size, the
    footer's, is at most 1/16 of the budget; these are written uncompressed, so that is their size in the file):
    the fill's units, read the same way, never in slices."""
    return int(max(cached_bytes / 2, 17 * truth["row_group_bytes"] / max(1, truth["row_groups"])))


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(f"/metrics has no {name}")


def _counters(url: str) -> dict[str, float]:
    text = http_get(url + "/metrics").decode()
    return {"ingested": _metric(text, "samplecache_ingested_bytes_total"),
            "needed": _metric(text, "samplecache_remote_needed_bytes_total"),
            "fetched": _metric(text, "samplecache_remote_sampler_bytes_total"),
            "evicted_shards": sum(float(line.split()[1]) for line in text.splitlines()
                                  if line.startswith("samplecache_evictions_total{"))}


def rolling_run(spec: Spec, truth: dict[str, Any], s3: Any, root: Path, samplers: int, seconds: float,
                startup_s: float, cached_bytes: int) -> dict[str, Any]:
    """CPU per MB of the daemon replacing shards in a full cache (see the module's doc); ``cached_bytes``: what
    the whole dataset took in the cache."""
    budget = budget_for(truth, cached_bytes)
    if budget >= 0.9 * cached_bytes:
        return {"error": f"the dataset is too small to roll: reading whole row groups takes a budget of 17 of them "
                         f"({budget / MB:,.0f} MB), and all {truth['row_groups']} take {cached_bytes / MB:,.0f} MB in "
                         f"the cache; give it more row groups"}
    cache = root / f"cache-{spec.name}-rolling"
    shutil.rmtree(cache, ignore_errors=True)
    d = start_daemon(truth["url"] + "/", cache, samplers=samplers, max_bytes=budget, env=s3.env(),
                     log_path=root / f"daemon-{spec.name}-rolling.log", log_level="info", extra=["--pacing", "off"])
    data = cache / "lmdb" / "data.mdb"
    try:
        assert d.proc is not None
        t0 = time.monotonic()
        limit = 120 + FILL * budget / 1e6
        while (c0 := _counters(d.url))["ingested"] < FILL * budget:
            if time.monotonic() - t0 > limit:
                raise TimeoutError(f"{spec.name}: the daemon ingested {c0['ingested'] / MB:,.0f} MB in {limit:.0f} s, "
                                   f"short of {FILL * budget / MB:,.0f} MB\n{d.log_tail()}")
            time.sleep(POLL)
        fill_s = time.monotonic() - t0
        restarts0 = int(http_json(d.url + "/v1/status")["sampler"]["restarts"])
        size0, snap0, busy = _size(data), Snapshot.take(s3.pid, d.proc.pid), []
        while time.monotonic() - snap0.at < seconds:
            st = http_json(d.url + "/v1/status")
            busy.append(min(1.0, st["sampler"]["in_flight"] / max(1, st["sampler"]["processes"])))
            time.sleep(POLL)
        snap1, c1, size1 = Snapshot.take(s3.pid, d.proc.pid), _counters(d.url), _size(data)
        st = http_json(d.url + "/v1/status")
    finally:
        stop_daemon(d)
        shutil.rmtree(cache, ignore_errors=True)
    used = spent(snap0, snap1)
    restarts = int(st["sampler"]["restarts"]) - restarts0
    if restarts:  # a sampler started in the window: its start-up is not the steady state's
        used = dict(used, samplers=used["samplers"] - restarts * startup_s,
                    daemon_tree=used["daemon_tree"] - restarts * startup_s,
                    machine=used["machine"] - restarts * startup_s)
    mb = (c1["needed"] - c0["needed"]) / MB
    if mb <= 0:
        return {"error": f"nothing sampled in the {seconds:.0f} s window"}
    win = cpu_window(used, mb, snap1.at - snap0.at)
    return {"budget": budget, "fill_s": fill_s, "seconds": snap1.at - snap0.at, "mb": mb,
            "ingested_mb": (c1["ingested"] - c0["ingested"]) / MB,
            "evicted_shards": c1["evicted_shards"] - c0["evicted_shards"], "sampler_restarts": restarts,
            "amplification": (c1["fetched"] - c0["fetched"]) / (c1["needed"] - c0["needed"]),
            "data_file_mb": (size0 / MB, size1 / MB), "sampler_occupancy": sum(busy) / max(1, len(busy)),
            "mb_per_s": win["mb_per_s"], "proc_cpu_ms_per_mb": win["proc_cpu_ms_per_mb"],
            "cpu_ms_per_mb": win["cpu_ms_per_mb"], "cores": win["cores"],
            "parts": {k: 1000 * used[k] / mb for k in ("server", "daemon_main", "samplers")}}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _sys_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _write_new(path: Path, chunk: bytes, n: int) -> float:
    """Kernel CPU seconds to write ``n`` chunks into a new file (the page-cache copy, no sync)."""
    s0 = _sys_s()
    with open(path, "wb") as f:
        for _ in range(n):
            f.write(chunk)
    return _sys_s() - s0


def page_cache_tax(directory: Path, idle_s: float = IDLE_S) -> dict[str, Any]:
    """Kernel ms per MB of writing TAX_MB into a new file after ``idle_s`` of quiet (pages the guest has not used
    lately), then at once into another (the pages the first freed): what a growing cache pays per MB on this
    machine beyond the copy itself, which the fill (b) pays and the steady state (e) and the raw read do not."""
    chunk = os.urandom(1 << 20)
    n = int(TAX_MB * MB) >> 20
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "page-cache-tax.bin"
    try:
        time.sleep(idle_s)
        fresh = _write_new(path, chunk, n)
        path.unlink()
        reused = _write_new(path, chunk, n)
    finally:
        path.unlink(missing_ok=True)
    mb = n * (1 << 20) / MB
    out = {"mb": mb, "fresh_ms_per_mb": 1000 * fresh / mb, "reused_ms_per_mb": 1000 * reused / mb}
    out["tax_ms_per_mb"] = max(0.0, out["fresh_ms_per_mb"] - out["reused_ms_per_mb"])
    return out
