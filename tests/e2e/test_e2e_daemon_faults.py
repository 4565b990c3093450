"""End to end: the daemon under local faults — a full disk, its cache dir deleted, SIGTERM to its process group,
a flood of epoch seals. Each test runs a real ``samplecache serve`` against the real S3 server (conftest.py).

- disk full on a small tmpfs made by the test: sampling pauses with a reason, /healthz stays 200, a SIGKILLed
  daemon restarts on the full disk (no crash loop), sampling resumes when space returns, and every shard reads back
  exactly (0 corruption);
- a full disk, then a lower budget: ingest resumes within seconds (LMDB reuses the pages an eviction freed only
  after one more commit), and the log says "disk space is back" once, not at every failed retry;
- the cache dir deleted under a sampling daemon: /healthz answers 503 naming it within 10 s, and the daemon exits 1
  (an idle one: test_e2e_cache_identity.py);
- SIGTERM to the whole process group (what systemd and ``docker stop`` send): exit 0, no sampler replaced, no
  warning line;
- 300 epoch seals by plain GETs: the kept manifests stay bounded (``--epochs-kept``), older ones answer 410.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cache_check import check_cache

pytestmark = pytest.mark.e2e

ROWS_PER_GROUP, ROW_FLOATS = 128, 1024  # ~0.5 MiB per row group, incompressible
FILES, GROUPS = 6, 4                    # ~12 MiB in all


def call(url: str, method: str = "GET", headers: dict[str, str] | None = None,
         timeout: float = 30.0) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, body[:300]


def status(d: Any) -> dict[str, Any]:
    code, body = call(d.url + "/v1/status")
    assert code == 200, (code, body)
    return body  # type: ignore[no-any-return]


@pytest.fixture
def noise_source(s3: Any, bucket: str) -> str:
    fs = s3.fs()
    prefix = f"{bucket}/faults-noise"
    rng = np.random.default_rng(5)
    for i in range(FILES):
        rows = GROUPS * ROWS_PER_GROUP
        x = rng.standard_normal((rows, ROW_FLOATS), dtype=np.float32)
        table = pa.table({"id": pa.array(np.arange(i * rows, (i + 1) * rows, dtype=np.int64)),
                          "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), ROW_FLOATS)})
        with fs.open(f"{prefix}/part-{i:03d}.parquet", "wb") as f:
            pq.write_table(table, f, row_group_size=ROWS_PER_GROUP, compression="none", use_dictionary=False)
    return f"s3://{prefix}"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 7 MiB tmpfs: the disk a cache of ~12 MiB runs out of."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("guard", ["256KiB", "0"], ids=["guard", "no-guard-ENOSPC"])
def test_disk_full_pauses_restarts_and_recovers(daemon: Callable[..., Any], noise_source: str, small_disk: Path,
                                                until: Callable[..., Any], guard: str) -> None:
    """With the free-disk guard, sampling stops before the disk is full; with none (0), the disk really fills:
    staging files and LMDB commits fail with ENOSPC, and the daemon must pause, not crash or blame the remote."""
    cache = small_disk / "cache"
    args = ["--max-bytes", "64MiB", "--min-free-disk", guard, "--retry-seconds", "1"]
    d = daemon(noise_source, cache, samplers=1, extra=args)
    s = until(lambda: (lambda s: s if "disk" in (s["sampler"]["reason"] or "") else None)(status(d)), 90,
              "sampling to pause for the full disk")
    print(f"\npaused: {s['sampler']['reason']!r} with {s['shards']} shards, {s['bytes']} bytes, "
          f"disk_free {s['disk_free']}, lmdb {s['lmdb']}")
    assert s["shards"] > 0 and s["bytes"] < 7 << 20
    assert call(d.url + "/healthz")[0] == 200, "a full disk is a pause, not ill health"
    assert s["quarantined"] == [], "a full local disk must never be blamed on a remote file"
    time.sleep(2)
    assert d.proc.poll() is None, "the daemon died on a full disk"

    # killed on the full disk (staging files may be left behind): it starts again, and serves
    os.killpg(d.proc.pid, signal.SIGKILL)
    d.proc.wait(10)
    d2 = daemon(noise_source, cache, samplers=1, extra=args)
    s2 = status(d2)
    assert s2["shards"] >= s["shards"] - 1, (s2["shards"], s["shards"])
    assert call(d2.url + "/healthz")[0] == 200

    # space returns: sampling goes on by itself, and everything stored reads back exactly
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    until(lambda: status(d2)["shards"] > s2["shards"] + 2, 60, "sampling to resume once space is back")
    resumed = status(d2)
    assert "disk" not in (resumed["sampler"]["reason"] or "")
    summary = check_cache(cache / "lmdb")
    assert len(summary.shard_ids) == resumed["shards"] or len(summary.shard_ids) >= s2["shards"]
    print(f"after the remount: {resumed['shards']} shards; the checker read {len(summary.shard_ids)} shards, "
          f"0 problems")


def test_a_lower_budget_on_a_full_disk_resumes_ingest(daemon: Callable[..., Any], noise_source: str,
                                                      small_disk: Path, until: Callable[..., Any]) -> None:
    """No guard: LMDB's commits fail with an I/O error once the tmpfs is full. A lower budget evicts; the held
    shard used to fail for ever as the same transaction, which could not reuse the pages the eviction freed."""
    cache = small_disk / "cache"
    d = daemon(noise_source, cache, samplers=1, extra=["--max-bytes", "64MiB", "--min-free-disk", "0",
                                                       "--pacing", "off", "--retry-seconds", "1"])

    def ingested() -> int:
        s = status(d)
        return int(s["shards"]) + int(s["evictions"])

    until(lambda: "disk full while ingesting" in (status(d)["sampler"]["reason"] or ""), 90,
          "an LMDB commit to fail on the full disk")
    stuck, back = ingested(), d.log_tail(10 ** 6).count("disk space is back")
    time.sleep(4)  # four retries, each failing
    assert ingested() == stuck, "nothing was freed, yet a shard was written"
    assert d.log_tail(10 ** 6).count("disk space is back") == back, "a failing retry was logged as space back"

    req = urllib.request.Request(d.url + "/v1/config", method="PATCH", data=json.dumps({"max_bytes": "3MiB"}).encode(),
                                 headers={**d.headers, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    t0 = time.monotonic()
    until(lambda: ingested() >= stuck + 3, 30, "ingest to resume after the lower budget")
    print(f"\n{ingested() - stuck} shards ingested {time.monotonic() - t0:.1f} s after the PATCH; "
          f"reason now {status(d)['sampler']['reason']!r}")
    s = status(d)
    assert s["bytes"] <= 3 << 20 and s["health"]["problems"] == [], s
    assert d.log_tail(10 ** 6).count("disk space is back") >= back + 1


def test_cache_dir_deleted_makes_healthz_fail(daemon: Callable[..., Any], noise_source: str, tmp_path: Path,
                                              until: Callable[..., Any]) -> None:
    cache = tmp_path / "doomed"
    d = daemon(noise_source, cache, samplers=1, extra=["--max-bytes", "64MiB", "--min-free-disk", "1MiB"])
    until(lambda: status(d)["shards"] > 0, 60, "a first shard")
    assert call(d.url + "/healthz")[0] == 200
    shutil.rmtree(cache)
    t0 = time.monotonic()
    code, body = until(lambda: (lambda r: r if r[0] != 200 else None)(call(d.url + "/healthz")), 10,
                       "/healthz to report the removed cache dir")
    print(f"\n/healthz {code} after {time.monotonic() - t0:.1f}s: {body}")
    assert code == 503 and f"the cache dir {cache} was removed" in body["detail"], body
    assert d.proc.wait(20) == 1, d.log_tail()  # exits so that its service manager restarts it


def test_sigterm_to_the_process_group_is_a_clean_stop(daemon: Callable[..., Any], noise_source: str,
                                                       until: Callable[..., Any]) -> None:
    d = daemon(noise_source, samplers=2, extra=["--max-bytes", "64MiB", "--min-free-disk", "1MiB"])
    until(lambda: status(d)["shards"] > 0, 60, "a first shard")
    restarts = status(d)["sampler"]["restarts"]
    t0 = time.monotonic()
    os.killpg(d.proc.pid, signal.SIGTERM)
    code = d.proc.wait(20)
    took = time.monotonic() - t0
    log = d.log_path.read_text()
    tail = log[log.rfind("Started server process"):]
    print(f"\nexit {code} {took:.1f}s after SIGTERM to the group")
    assert code == 0, tail[-2000:]
    assert took < 15
    assert "died" not in tail and "replaced" not in tail and "WARNING" not in tail and "ERROR" not in tail, \
        tail[-2000:]
    assert restarts == 0


def test_sealing_is_bounded_by_retention(daemon: Callable[..., Any], noise_source: str, tmp_path: Path,
                                         until: Callable[..., Any]) -> None:
    cache = tmp_path / "cache"
    d = daemon(noise_source, cache, samplers=1, extra=["--max-bytes", "64MiB", "--min-free-disk", "1MiB",
                                                       "--epochs-kept", "5"])
    until(lambda: status(d)["shards"] > 0, 60, "a first shard")
    t0 = time.monotonic()
    for e in range(300):
        code, body = call(f"{d.url}/v1/epochs/{e}?max_samples=1")
        assert code == 200 and body["epoch"] == e, (code, body)
    took = time.monotonic() - t0
    s = status(d)
    assert s["epochs_sealed"] <= 6, s["epochs_sealed"]  # the last 5 and the freshly sealed (pinned) one
    assert len(s["epochs"]) <= 6 and s["last_epoch"] == 299
    code, body = call(f"{d.url}/v1/epochs/3")
    assert code == 410 and "no longer kept" in body["detail"], (code, body)
    raw = json.dumps(s).encode()
    summary = check_cache(cache / "lmdb")
    print(f"\n300 seals in {took:.1f}s ({300 / took:.0f}/s); /v1/status {len(raw)} bytes; "
          f"{len(summary.manifests) if hasattr(summary, 'manifests') else s['epochs_sealed']} manifests kept")
    assert len(raw) < 64 << 10


def test_quarantine_api_lists_and_releases(daemon: Callable[..., Any], s3: Any, bucket: str,
                                           until: Callable[..., Any]) -> None:
    fs = s3.fs()
    prefix = f"{bucket}/faults-quarantine"
    with fs.open(f"{prefix}/good.parquet", "wb") as f:
        pq.write_table(pa.table({"id": pa.array(range(100), pa.int64())}), f, row_group_size=50)
    fs.pipe(f"{prefix}/bad.parquet", b"garbage, not Parquet " * 50)
    d = daemon(f"s3://{prefix}", samplers=1, extra=["--max-bytes", "64MiB", "--min-free-disk", "1MiB",
                                                    "--discover-interval", "2"])
    q = until(lambda: (lambda r: r[1] if r[1]["total"] == 1 else None)(call(d.url + "/v1/quarantine")), 30,
              "the bad file in quarantine")
    entry = q["files"][0]
    assert entry["path"].endswith("bad.parquet") and entry["kind"] == "corrupt" and q["by_kind"] == {"corrupt": 1}
    assert "footer" in entry["reason"]
    name = entry["path"]
    assert call(f"{d.url}/v1/quarantine/{name}", "DELETE")[0] == 401, "a release needs the token"
    code, body = call(f"{d.url}/v1/quarantine/{prefix}/nothing.parquet", "DELETE", d.headers)
    assert code == 404 and "no quarantined file" in body["detail"], (code, body)
    # released while still bad: read again, quarantined again (with a new time)
    code, body = call(f"{d.url}/v1/quarantine/{name}", "DELETE", d.headers)
    assert code == 200 and body["released"], (code, body)
    until(lambda: (lambda f: f if f and not f[0]["released"] and f[0]["at"] > entry["at"] else None)(
        call(d.url + "/v1/quarantine")[1]["files"]), 30, "the still-bad file quarantined again")
    # the file is fixed (a new size and ETag): it leaves quarantine by itself and its rows are cached
    with fs.open(f"{prefix}/bad.parquet", "wb") as f:
        pq.write_table(pa.table({"id": pa.array(range(100, 130), pa.int64())}), f)
    until(lambda: call(d.url + "/v1/quarantine")[1]["total"] == 0, 30, "the fixed file to leave quarantine")
    s = until(lambda: (lambda s: s if s["samples"] == 130 else None)(status(d)), 30, "its rows cached")
    assert s["coverage"]["units_left_out"] == 0 and s["coverage"]["row_fraction"] == 1.0, s["coverage"]


def test_a_truncated_cache_file_stops_serve_with_exit_2_and_reset_cache_recovers(
        daemon: Callable[..., Any], noise_source: str, tmp_path: Path, until: Callable[..., Any], s3: Any) -> None:
    cache = tmp_path / "cache"
    d = daemon(noise_source, cache, samplers=1, extra=["--max-bytes", "64MiB", "--min-free-disk", "1MiB"])
    until(lambda: status(d)["shards"] >= 3, 60, "a few shards")
    daemon.stop(d)
    data = cache / "lmdb" / "data.mdb"
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    cmd = [*d.args]
    got = subprocess.run(cmd, env=s3.env(), capture_output=True, text=True, timeout=60)
    lines = [ln for ln in got.stderr.splitlines() if "samplecache serve" in ln]
    print(f"\ntruncated {size} -> {size // 2} bytes: exit {got.returncode}: {lines}")
    assert got.returncode == 2, got.stderr[-2000:]
    assert len(lines) == 1 and str(data) in lines[0] and "--reset-cache" in lines[0], got.stderr[-2000:]
    d2 = daemon(noise_source, cache, samplers=1, extra=["--max-bytes", "64MiB", "--min-free-disk", "1MiB",
                                                        "--reset-cache"])
    until(lambda: status(d2)["shards"] >= 1, 60, "a fresh start to ingest again")
    assert "--reset-cache" in d2.log_path.read_text()


def test_a_unit_that_always_fails_is_given_up_for_the_pass_not_the_cycle(daemon: Callable[..., Any], s3: Any,
                                                                         noise_source: str,
                                                                         until: Callable[..., Any]) -> None:
    """Every read of one file is refused (403) after discovery: its units fail 8 times in a row each and are
    given up for this pass; every other file is cached in full, nothing is quarantined, and the status never
    claims the whole dataset is cached."""
    from faultproxy import FaultProxy

    with FaultProxy(s3.port, seed=3) as proxy:
        env = s3.env()
        env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = proxy.endpoint
        d = daemon(noise_source, samplers=1, env=env, extra=["--max-bytes", "64MiB", "--min-free-disk", "1MiB",
                                                             "--retry-seconds", "0.05"])
        assert call(d.url + "/v1/samplers/pause", "POST", d.headers)[0] == 200
        until(lambda: status(d)["sampler"]["in_flight"] == 0, 30, "in-flight units to finish")
        cached = {s["path"] for s in call(d.url + "/v1/shards?limit=1000")[1]["shards"]}
        target = next(f"part-{i:03d}.parquet" for i in range(FILES) if not any(
            p.endswith(f"part-{i:03d}.parquet") for p in cached))
        proxy.answer_error(target, 600, 403)
        assert call(d.url + "/v1/samplers/resume", "POST", d.headers)[0] == 200
        want = (FILES - 1) * GROUPS * ROWS_PER_GROUP
        seen: list[dict[str, Any]] = []

        def done() -> Any:
            s = status(d)
            seen.append(s)
            return s if s["samples"] >= want and s["health"]["units_given_up"] >= GROUPS else None
        s = until(done, 90, "the other files cached and the refused file's units given up")
        print(f"\nrefused {target}: {s['health']['units_given_up']} unit(s) given up, {s['samples']} of "
              f"{FILES * GROUPS * ROWS_PER_GROUP} rows cached, unit failures {s['health']['unit_failures']}")
        assert s["quarantined"] == [] and s["coverage"]["row_fraction"] < 1.0
        assert not any("whole remote dataset" in (x["sampler"]["reason"] or "") for x in seen)
        assert target in d.log_path.read_text() and "giving up" in d.log_path.read_text()
        daemon.stop(d)
