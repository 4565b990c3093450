"""Load on a running daemon and what its process uses (``benchmarks.daemon_scale``).

``load(port, path, clients, k, expected, procs, method, token)``: ``clients`` concurrent keep-alive HTTP clients
(spread over ``procs`` spawned processes x threads, released together once every process is up), ``k`` requests
of ``path`` each (GET, or POST with an empty JSON body and the API ``token``); every body must equal ``expected``;
latency percentiles, requests/s, MB/s, errors. ``sequential(url, n)``: one client, ``n`` GETs. ``memory(pid)``:
VmRSS / VmHWM / RssAnon / RssFile of the daemon and the RSS of each child (its samplers); ``cpu_seconds(pid)``.
"""

from __future__ import annotations

import http.client
import multiprocessing as mp
import os
import statistics
import threading
import time
from typing import Any

import numpy as np

from ..harness import MB, http_get


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(np.ceil(q / 100.0 * len(s))) - 1))
    return s[k]


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


def _client_thread(port: int, path: str, k: int, expected: bytes, out: dict[str, Any], method: str = "GET",
                   token: str | None = None) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    sent, headers = (b"{}", {"Content-Type": "application/json"}) if method == "POST" else (None, {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    lat, errors, nbytes = [], [], 0
    try:
        for _ in range(k):
            t0 = time.perf_counter()
            try:
                conn.request(method, path, sent, headers)
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
                 q: Any, method: str = "GET", token: str | None = None) -> None:
    results: list[dict[str, Any]] = [{} for _ in range(threads)]
    ts = [threading.Thread(target=_client_thread, args=(port, path, k, expected, results[i], method, token))
          for i in range(threads)]
    ready.put(os.getpid())
    go.wait()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put(results)


def load(port: int, path: str, clients: int, k: int, expected: bytes, procs: int,
         method: str = "GET", token: str | None = None) -> dict[str, Any]:
    """``clients`` concurrent keep-alive clients (``procs`` processes x threads), ``k`` requests each,
    released together once every process is up."""
    procs = max(1, min(procs, clients))
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    ctx = mp.get_context("spawn")
    q, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    ps = [ctx.Process(target=_client_proc, args=(port, path, n, k, expected, ready, go, q, method, token))
          for n in per if n]
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
