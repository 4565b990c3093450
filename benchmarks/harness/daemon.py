"""The real daemon under a benchmark: start, wait for samples (or idle), fetch manifests, stop.

``start_daemon(source, cache, ...)`` runs ``samplecache serve`` through ``samplecache_tools.launch.DaemonProcess``
(its own process group; log in ``log_path``) and waits for ``/healthz``. ``stop_daemon(d)`` stops it and
raises with the log tail when it exited badly. ``wait_samples`` polls ``/v1/status`` until the cache holds
exactly the expected samples (quarantined files, more samples than the source, a dead daemon or the time
budget raise); ``wait_idle`` until the sampler pauses with the whole remote cached, timing start-up.

``build_cache(spec, root, log)`` is the loader benchmarks' cache of a generated ``Spec``: the daemon on
``file://root/parquet`` (``--samplers 2``, a budget nothing is evicted from), every sample cached, epoch 0
sealed over all of them; reused while the parameters match; no daemon left running. ``serve(spec, root)``
restarts the daemon on that cache (idle: everything is resident) and checks it serves the same epoch 0.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Sequence

from samplecache_tools.launch import DaemonProcess

from .data import MB, Log, Spec, read_json, write_json


def http_get(url: str, timeout: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()  # type: ignore[no-any-return]


def http_json(url: str, timeout: float = 30.0) -> Any:
    return json.loads(http_get(url, timeout))


def http_post(url: str, body: Any, token: str | None = None, timeout: float = 30.0) -> bytes:
    """POST ``body`` as JSON (with the daemon's API ``token``, when it needs one); the response's bytes."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()  # type: ignore[no-any-return]


def start_daemon(source: str, cache: Path, *, samplers: int = 2, max_bytes: int | None = None,
                 log_path: Path | None = None, log_level: str | None = "warning", extra: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, timeout: float = 120.0, ready: bool = True) -> DaemonProcess:
    """``samplecache serve --source SOURCE --cache-dir CACHE --samplers N [--max-bytes B] EXTRA``, healthy
    (``ready=False``: just spawned; call ``d.wait_ready``). ``env``: the daemon's environment (S3 credentials).
    ``log_level`` None: the daemon's default."""
    args = ["--samplers", str(samplers), *(["--max-bytes", str(max_bytes)] if max_bytes else []),
            *(["--log-level", log_level] if log_level else []), *extra]
    d = DaemonProcess(source, cache.resolve(), log_path=log_path, extra=args, env=env)
    return d.start(timeout=timeout, ready=ready)


def stop_daemon(d: DaemonProcess) -> None:
    """SIGTERM (then SIGKILL); raises with the log tail unless it exited cleanly."""
    code = d.stop()
    if code not in (0, None):
        raise RuntimeError(f"daemon exited with code {code}:\n{d.log_tail()}")


def wait_samples(d: DaemonProcess, samples: int, log: Log, *, name: str = "cache", budget: float = 300.0,
                 exact: bool = True, poll: float = 0.2) -> float:
    """Until ``/v1/status`` reports ``samples`` resident; the seconds it took. ``exact``: more is an error."""
    t0 = last = time.monotonic()
    last -= 10
    while True:
        st = http_json(d.url + "/v1/status")
        if st["quarantined"]:
            raise RuntimeError(f"daemon quarantined files: {st['quarantined']}")
        if exact and st["samples"] > samples:
            raise RuntimeError(f"daemon holds {st['samples']} samples, more than the {samples} of the source")
        if st["samples"] >= samples:
            log(f"{name}: cached {st['samples']:,} samples, {st['bytes'] / MB:,.1f} MB, "
                f"{st['shards']} shards in {time.monotonic() - t0:.1f}s")
            return time.monotonic() - t0
        if d.proc is not None and d.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with code {d.proc.returncode}:\n{d.log_tail()}")
        if time.monotonic() - t0 > budget:
            raise TimeoutError(f"{name}: only {st['samples']} of {samples} samples cached after "
                               f"{budget:.0f}s (last error: {st['last_error']})\n{d.log_tail()}")
        if time.monotonic() - last > 10:
            log(f"{name}: {st['samples']:,} / {samples:,} samples cached ({st['sampler']['state']})")
            last = time.monotonic()
        time.sleep(poll)


def wait_idle(d: DaemonProcess, t0: float, timeout: float = 600.0) -> dict[str, float]:
    """After ``d`` is healthy: seconds from ``t0`` (``time.monotonic()`` before the start) to ``/readyz`` and to
    the sampler paused with the whole remote dataset cached."""
    deadline = t0 + timeout
    ready = idle = None
    while time.monotonic() < deadline and (ready is None or idle is None):
        if ready is None:
            try:
                http_get(d.url + "/readyz", timeout=30)
                ready = time.monotonic() - t0
            except urllib.error.HTTPError:
                pass
        if ready is not None:
            st = http_json(d.url + "/v1/status")
            if st["sampler"]["state"] == "paused" and "whole remote dataset" in (st["sampler"]["reason"] or ""):
                idle = time.monotonic() - t0
            elif st["sampler"]["state"] == "remote error" or st["quarantined"]:
                raise RuntimeError(f"daemon: {st['sampler']} {st['last_error']} {st['quarantined']}")
        if idle is None:
            time.sleep(0.05)
    if ready is None or idle is None:
        raise TimeoutError(f"daemon not idle after {timeout:.0f} s:\n{d.log_tail()}")
    return {"readyz_s": ready, "idle_s": idle}


def fetch_epoch(d: DaemonProcess, epoch: int = 0) -> dict[str, Any]:
    """The manifest of ``epoch`` (sealed by this request if it is new; waits up to 30 s for a first sample)."""
    return http_json(f"{d.url}/v1/epochs/{epoch}?min_samples=1&timeout=30", timeout=90)  # type: ignore[no-any-return]


def all_shards(d: DaemonProcess) -> list[dict[str, Any]]:
    """Every shard of ``GET /v1/shards``, page by page."""
    out: list[dict[str, Any]] = []
    while True:
        page = http_json(f"{d.url}/v1/shards?offset={len(out)}&limit=1000")
        out += page["shards"]
        if not page["shards"] or len(out) >= page["total"]:
            return out


# --- the loader benchmarks' cache of a generated Spec ------------------------------------------------

def start_spec_daemon(spec: Spec, root: Path) -> DaemonProcess:
    """The daemon on ``file://root/parquet`` with ``root/cache``, a budget nothing is evicted from."""
    max_bytes = 2 * spec.samples * (spec.payload + 64) + (256 << 20)
    return start_daemon(f"file://{(root / 'parquet').resolve()}", root / "cache", samplers=2, max_bytes=max_bytes,
                        log_path=root / "daemon.log")


def build_cache(spec: Spec, root: Path, log: Log) -> dict[str, Any]:
    """The cache of ``spec`` with epoch 0 sealed over every sample; its manifest. No daemon left running."""
    build_path, cache = root / "build.json", root / "cache"
    got = read_json(build_path)
    if got is not None and got.get("params") == spec.params() and (cache / "lmdb" / "data.mdb").exists():
        log(f"{spec.name}: reusing cache {cache}")
        return got["manifest"]  # type: ignore[no-any-return]
    if cache.exists():
        shutil.rmtree(cache)
    build_path.unlink(missing_ok=True)
    d = start_spec_daemon(spec, root)
    try:
        wait_samples(d, spec.samples, log, name=spec.name, budget=120.0 + spec.samples * spec.payload / 10e6)
        manifest = fetch_epoch(d)
    finally:
        stop_daemon(d)
    if manifest["samples"] != spec.samples:
        raise RuntimeError(f"epoch 0 sealed with {manifest['samples']} samples, expected {spec.samples}")
    write_json(build_path, {"params": spec.params(), "manifest": manifest})
    return manifest


def serve(spec: Spec, root: Path, manifest: dict[str, Any]) -> DaemonProcess:
    """The daemon restarted on the built cache (idle), checked to serve ``manifest`` as epoch 0 (or, once epoch 0
    left the kept epochs, the same shards as its newest epoch: each restart seals one more, ``--epochs-kept``)."""
    d = start_spec_daemon(spec, root)
    try:
        try:
            served = fetch_epoch(d)
            same = served.get("sealed_at") == manifest.get("sealed_at") and served["shards"] == manifest["shards"]
        except urllib.error.HTTPError as e:
            if e.code != 410:
                raise
            served = fetch_epoch(d, http_json(d.url + "/v1/status")["last_epoch"])
            same = served["shards"] == manifest["shards"]
        if not same:
            raise RuntimeError("the restarted daemon serves other shards than the cache built (epoch 0)")
    except BaseException:
        d.stop()
        raise
    return d
