"""End to end, the HTTP surface against a hostile local user: the token every mutation needs (a token file
with no setup), bodies refused before they are read, strict request models, error bodies that match the
OpenAPI and echo nothing. Each test starts the real daemon (``samplecache serve``) as a subprocess."""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from paths import SCRIPTS

pytestmark = pytest.mark.e2e

MiB = 2**20
ATTACK_S = 3.0  # seconds of 8 concurrent 50 MB PATCHes
RUN = "0123456789abcdef"


# ----------------------------------------------------------------------------------------------- helpers
def request(url: str, method: str, path: str, body: Any = None, headers: dict[str, Any] | None = None,
            raw: bytes | None = None, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """One request over http.client (header values may be bytes): (status, headers, body)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.putrequest(method, path)
        for k, v in {**({"Content-Type": "application/json"} if data is not None else {}), **(headers or {})}.items():
            conn.putheader(k, v)
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def problem(reply: tuple[int, dict[str, str], bytes], code: int, *words: str) -> str:
    """The reply is ``code`` with a JSON ``{"detail": str}`` body (as the Problem model says) naming ``words``."""
    status, headers, body = reply
    assert status == code, f"expected {code}, got {status}: {body[:300]!r}"
    assert headers.get("content-type", "").startswith("application/json"), headers
    got = json.loads(body)
    assert isinstance(got, dict) and isinstance(got.get("detail"), str) and got["detail"], got
    assert set(got) <= {"detail", "next_epoch", "known"}, got
    for w in words:
        assert w.lower() in got["detail"].lower(), f"{w!r} not in {got['detail']!r}"
    return str(got["detail"])


def config(url: str) -> dict[str, Any]:
    status, _, body = request(url, "GET", "/v1/config")
    assert status == 200
    return json.loads(body)  # type: ignore[no-any-return]


def status_of(url: str) -> dict[str, Any]:
    code, _, body = request(url, "GET", "/v1/status")
    assert code == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def sealed(url: str) -> None:
    code, _, body = request(url, "GET", "/v1/epochs/0?min_samples=1&timeout=60", timeout=90)
    assert code == 200, body


def serve_refused(args: list[str], tmp_path: Path, timeout: float = 60) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "samplecache_service", "serve", "--source", "file:///nowhere",
                        "--cache-dir", str(tmp_path / "cache"), "--port", "0", *args],
                       env={k: v for k, v in os.environ.items() if not k.startswith("SAMPLECACHE_")},
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stderr


# ----------------------------------------------------------------------------------------------- the token file
def test_token_file_is_created_0640_whatever_the_umask_and_named_in_status(daemon: Any, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old = os.umask(0)  # the daemon inherits it: its token file must still be 0640
    try:
        d = daemon(cache_dir=cache, samplers=1)
    finally:
        os.umask(old)
    path = cache / "api-token"
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640, oct(st.st_mode)
    token = path.read_text().strip()
    assert len(token) >= 40 and token == d.token
    assert status_of(d.url)["auth"] == {"required": True, "token_file": str(path.resolve())}
    assert token not in json.dumps(status_of(d.url))
    problem(request(d.url, "POST", "/v1/samplers/pause"), 401, "token")
    assert request(d.url, "POST", "/v1/samplers/pause", headers=d.headers)[0] == 200

    daemon.stop(d)  # a restart reuses the file: the token stays
    d2 = daemon(cache_dir=cache, samplers=1)
    assert path.read_text().strip() == token
    assert request(d2.url, "POST", "/v1/samplers/resume", headers={"Authorization": f"Bearer {token}"})[0] == 200


def test_a_token_file_already_there_is_used(daemon: Any, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "api-token").write_text("chosen-by-the-admin\n")
    d = daemon(cache_dir=cache, samplers=1)
    assert request(d.url, "POST", "/v1/samplers/pause",
                   headers={"Authorization": "Bearer chosen-by-the-admin"})[0] == 200
    problem(request(d.url, "POST", "/v1/samplers/resume", headers={"Authorization": "Bearer chosen-by-the"}), 401)
    assert (cache / "api-token").read_text() == "chosen-by-the-admin\n"  # untouched


def test_a_symlink_where_the_token_file_goes_is_refused(daemon: Any, tmp_path: Path) -> None:
    cache, target = tmp_path / "cache", tmp_path / "elsewhere"
    cache.mkdir()
    target.write_text("planted-token\n")
    (cache / "api-token").symlink_to(target)
    d = daemon(cache_dir=cache, samplers=1, ready=False)
    assert d.proc.wait(90) != 0
    log = d.log_tail(20000)
    assert "symbolic link" in log and str(cache / "api-token") in log, log
    assert target.read_text() == "planted-token\n"


def test_auth_off_beyond_loopback_is_refused(tmp_path: Path) -> None:
    t0 = time.monotonic()
    code, err = serve_refused(["--host", "0.0.0.0", "--auth", "off"], tmp_path)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if "--auth" in ln]
    assert len(lines) == 1 and "loopback" in lines[0] and "0.0.0.0" in lines[0], err
    assert "Traceback" not in err and time.monotonic() - t0 < 30
    assert not (tmp_path / "cache").exists()  # refused before anything was made
    code, err = serve_refused(["--host", "127.0.0.1", "--auth", "of"], tmp_path)
    assert code == 2 and "--auth" in err, err


def test_auth_off_on_loopback_and_a_given_token(daemon: Any, tmp_path: Path) -> None:
    d = daemon(cache_dir=tmp_path / "open", samplers=1, extra=["--auth", "off"])
    assert status_of(d.url)["auth"] == {"required": False, "token_file": None}
    assert request(d.url, "POST", "/v1/samplers/pause")[0] == 200
    assert not (tmp_path / "open" / "api-token").exists()
    d2 = daemon(cache_dir=tmp_path / "given", samplers=1, extra=["--token", "s3cret"])
    assert status_of(d2.url)["auth"] == {"required": True, "token_file": None}  # the admin hands it out
    assert not (tmp_path / "given" / "api-token").exists()
    problem(request(d2.url, "POST", "/v1/samplers/pause"), 401)
    assert request(d2.url, "POST", "/v1/samplers/pause", headers={"Authorization": "Bearer s3cret"})[0] == 200


# ----------------------------------------------------------------------------------------------- every mutation
def _mutations(url: str) -> list[tuple[str, str]]:
    code, _, body = request(url, "GET", "/openapi.json")
    assert code == 200
    spec = json.loads(body)
    return sorted((m.upper(), p) for p, ops in spec["paths"].items() for m in ops if m not in ("get", "head"))


def test_no_mutation_succeeds_without_the_token(daemon: Any) -> None:
    d = daemon(samplers=1)
    sealed(d.url)
    good = d.headers
    lease = json.loads(request(d.url, "POST", "/v1/epochs/0/leases", {"ttl": 600}, headers=good)[2])
    # (method, path template) -> (the path, its body): one of each mutating route the OpenAPI lists
    calls: dict[tuple[str, str], tuple[str, Any]] = {
        ("POST", "/v1/samplers/pause"): ("/v1/samplers/pause", None),
        ("POST", "/v1/samplers/resume"): ("/v1/samplers/resume", None),
        ("PATCH", "/v1/config"): ("/v1/config", {"eviction_policy": "random", "epoch_max_samples": 7}),
        ("POST", "/v1/jobs"): ("/v1/jobs", {"name": "hostile", "run": RUN}),
        ("POST", "/v1/jobs/{name}/epochs/{job_epoch}"): (f"/v1/jobs/hostile/epochs/0?run={RUN}&timeout=30", None),
        ("PUT", "/v1/jobs/{name}/epochs/{job_epoch}/mixture"): (
            f"/v1/jobs/hostile/epochs/0/mixture?run={RUN}", {"mixture": {"default": 1.0}, "counts": {"default": 5}}),
        ("POST", "/v1/epochs/{epoch}/leases"): ("/v1/epochs/0/leases", {"ttl": 600}),
        ("POST", "/v1/epochs/{epoch}/leases/{lease_id}/heartbeat"): (f"/v1/epochs/0/leases/{lease['id']}/heartbeat",
                                                                     {"read": 5}),
        ("DELETE", "/v1/epochs/{epoch}/leases/{lease_id}"): (f"/v1/epochs/0/leases/{lease['id']}", None),
        ("DELETE", "/v1/quarantine/{file}"): ("/v1/quarantine/a.parquet", None),
    }
    listed = _mutations(d.url)
    assert set(listed) <= set(calls), f"mutating routes in the OpenAPI: {listed}; extend this test"
    calls = {key: call for key, call in calls.items() if key in listed}  # each the OpenAPI lists, in this order
    assert len(calls) >= 8
    before = (config(d.url), status_of(d.url)["leases"])
    bad_headers: list[dict[str, Any]] = [
        {}, {"Authorization": "Bearer nope"}, {"Authorization": d.token}, {"Authorization": f"Basic {d.token}"},
        {"Authorization": f"Bearer {d.token}x"}, {"Authorization": "Bearer " + d.token[:-1]},
        {"Authorization": b"Bearer \xc3\xa9t\xc3\xa9"}, {"Authorization": "Bearer \u00e9t\u00e9".encode("latin-1")},
        {"Authorization": b"Bearer " + d.token.encode() + b"\xff"}]
    for (method, _), (path, body) in calls.items():
        for headers in bad_headers:
            problem(request(d.url, method, path, body, headers=headers), 401, "token")
    after = status_of(d.url)
    assert (config(d.url), after["leases"]) == before
    assert after["jobs"] == 0 and after["sampler"]["reason"] != "paused by request"

    got = {key: request(d.url, key[0], path, body, headers=good)[0] for key, (path, body) in calls.items()}
    want = {**{k: 200 for k in calls}, ("POST", "/v1/epochs/{epoch}/leases"): 201,
            ("DELETE", "/v1/epochs/{epoch}/leases/{lease_id}"): 204,
            ("PUT", "/v1/jobs/{name}/epochs/{job_epoch}/mixture"): 204,
            ("DELETE", "/v1/quarantine/{file}"): 404}  # nothing is quarantined: served, not refused
    assert got == {k: want[k] for k in calls}, got
    assert config(d.url)["eviction_policy"] == "random" and config(d.url)["epoch_max_samples"] == 7
    assert status_of(d.url)["jobs"] == 1
    assert [x["id"] for x in status_of(d.url)["leases"]] != [lease["id"]]  # released; the one taken just now lives


def test_leases_past_the_caps_are_429_and_status_counts_them(daemon: Any) -> None:
    d = daemon(samplers=1, extra=["--max-leases", "5", "--max-leases-per-job", "2"])
    sealed(d.url)
    code, _, body = request(d.url, "POST", "/v1/jobs", {"name": "greedy", "run": RUN}, headers=d.headers)
    assert code == 200, body
    code, _, body = request(d.url, "POST", f"/v1/jobs/greedy/epochs/0?run={RUN}&timeout=30", headers=d.headers)
    assert code == 200, body
    epoch = json.loads(body)["daemon_epoch"]
    job = {"job": "greedy", "run": RUN, "job_epoch": 0}
    for _ in range(2):
        assert request(d.url, "POST", f"/v1/epochs/{epoch}/leases", job, headers=d.headers)[0] == 201
    refused = request(d.url, "POST", f"/v1/epochs/{epoch}/leases", job, headers=d.headers)
    problem(refused, 429, "job 'greedy' holds 2 leases", "--max-leases-per-job")
    assert float(refused[1]["retry-after"]) > 0
    for _ in range(3):  # leases of no job count for the host only
        assert request(d.url, "POST", f"/v1/epochs/{epoch}/leases", {}, headers=d.headers)[0] == 201
    problem(request(d.url, "POST", f"/v1/epochs/{epoch}/leases", {}, headers=d.headers), 429, "--max-leases")
    st = status_of(d.url)
    assert (st["leases_live"], st["leases_by_job"], len(st["leases"])) == (5, {"greedy": 2}, 5)


# ----------------------------------------------------------------------------------------------- strict input
def test_bodies_are_strict_and_errors_echo_nothing(daemon: Any) -> None:
    d = daemon(samplers=1)
    sealed(d.url)
    h = d.headers
    before = config(d.url)
    for body, field in [({"max_bytes": True}, "max_bytes"), ({"max_bytes": False}, "max_bytes"),
                        ({"max_bytes": 9899.0}, "max_bytes"), ({"epoch_max_samples": 1.0}, "epoch_max_samples"),
                        ({"epoch_max_samples": "7"}, "epoch_max_samples"), ({"min_free_disk": [1]}, "min_free_disk"),
                        ({"max_bytes": 2**70}, "max_bytes"), ({"max_bytes": "12 parsecs"}, "max_bytes"),
                        ({"replace_per_epoch": "0.5"}, "replace_per_epoch"), ({"pacing": True}, "pacing"),
                        ({"nope": 1}, "nope"), ({"max_bytes": 4096, "extra": None}, "extra")]:
        problem(request(d.url, "PATCH", "/v1/config", body, headers=h), 422, field)
    problem(request(d.url, "PATCH", "/v1/config", raw=b"[1, 2]", headers=h), 422, "body")
    problem(request(d.url, "PATCH", "/v1/config", raw=b"{not json", headers=h), 422, "json")
    for body, field in [({"ttl": 60, "extra": 1}, "extra"), ({"ttl": True}, "ttl"), ({"ttl": "60"}, "ttl"),
                        ({"holder": 5}, "holder"), ({"job_epoch": 1.0}, "job_epoch"), ({"ttl": 60, "id": "x"}, "id")]:
        problem(request(d.url, "POST", "/v1/epochs/0/leases", body, headers=h), 422, field)
    lease = json.loads(request(d.url, "POST", "/v1/epochs/0/leases", {"ttl": 60}, headers=h)[2])
    for body, field in [({"read": True}, "read"), ({"read": 3.0}, "read"), ({"read": "3"}, "read"),
                        ({"read": 3, "more": 1}, "more")]:
        problem(request(d.url, "POST", f"/v1/epochs/0/leases/{lease['id']}/heartbeat", body, headers=h), 422, field)
    for body, field in [({"name": "j", "run": RUN, "resume": "yes"}, "resume"), ({"name": "j", "run": RUN, "resume": 1},
                        "resume"), ({"name": 5, "run": RUN}, "name"), ({"name": "j", "run": RUN, "x": 0}, "x")]:
        problem(request(d.url, "POST", "/v1/jobs", body, headers=h), 422, field)
    assert config(d.url) == before and status_of(d.url)["jobs"] == 0

    # a large bad value is not echoed (nor is its field name in full)
    huge = "z" * 900_000
    for body in ({"max_bytes": huge}, {"eviction_policy": huge}, {"pacing": huge}, {huge: 1}):
        detail = problem(request(d.url, "PATCH", "/v1/config", body, headers=h), 422)
        assert "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz" not in detail and len(detail) < 1000
    detail = problem(request(d.url, "PATCH", "/v1/config", {"eviction_policy": "wipe-everything"}, headers=h), 422,
                     "eviction_policy")
    assert "wipe-everything" not in detail

    # query and path numbers: bounded, never a 500
    for path in ("/v1/epochs/99999999999999999999999999", "/v1/epochs/-1", "/v1/epochs/0?timeout=1e308",
                 "/v1/epochs/0?timeout=nan", "/v1/epochs/0?timeout=inf", "/v1/epochs/0?min_samples=1e3",
                 "/v1/epochs/0?max_samples=99999999999999999999999", "/v1/shards?offset=99999999999999999999999",
                 "/v1/shards?limit=0", "/v1/epochs/0?format=xml", "/v1/jobs/%00"):
        problem(request(d.url, "GET", path), 422)
    problem(request(d.url, "DELETE", f"/v1/epochs/0/leases/{lease['id']}?read=-1", headers=h), 422, "read")
    problem(request(d.url, "POST", f"/v1/jobs/j/epochs/99999999999999999999?run={RUN}", headers=h), 422, "job_epoch")

    # unknown routes and methods, and every status the routes declare: JSON problems
    problem(request(d.url, "GET", "/v2/nothing"), 404)
    problem(request(d.url, "PUT", "/v1/config", {"max_bytes": 1}, headers=h), 405)
    problem(request(d.url, "GET", "/v1/jobs/nobody"), 404, "nobody")
    spec = json.loads(request(d.url, "GET", "/openapi.json")[2])
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for code, resp in op["responses"].items():
                if code.startswith("4") or code == "503":
                    schema = resp["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Problem"}, (method, path, code, schema)
            if op.get("requestBody") or method != "get":
                assert {"401", "413"} <= set(op["responses"]) or path.startswith("/v1/quarantine"), (method, path)


# ----------------------------------------------------------------------------------------------- 50 MB bodies
def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_fifty_megabyte_bodies_cost_the_daemon_no_memory(daemon: Any, typed_dataset: Any) -> None:
    d = daemon(samplers=1)
    deadline = time.monotonic() + 60
    while status_of(d.url)["samples"] < typed_dataset.rows and time.monotonic() < deadline:
        time.sleep(0.2)  # the whole dataset cached: the daemon is idle
    before = config(d.url)
    idle = sorted(_rss_kib(d.proc.pid) for _ in range(10) if time.sleep(0.05) is None)[5]
    peak, latencies, stop = [idle], [], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak.append(_rss_kib(d.proc.pid))
            t0 = time.perf_counter()
            code = request(d.url, "GET", "/healthz", timeout=5)[0]
            latencies.append((time.perf_counter() - t0, code))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        flood = subprocess.run([sys.executable, str(SCRIPTS / "body_flood.py"), d.url, str(ATTACK_S)],
                               capture_output=True, text=True, timeout=120)
        assert flood.returncode == 0, flood.stderr
        # with the token: a 50 MB body announced (413 at once) and one streamed (413 at the limit)
        sys.path.insert(0, str(SCRIPTS))
        try:
            from body_flood import send_huge
        finally:
            sys.path.remove(str(SCRIPTS))
        authed = [send_huge(d.url, [f"Authorization: Bearer {d.token}"], 50 * MiB, chunked)
                  for chunked in (False, True)]
        time.sleep(0.3)
    finally:
        stop.set()
        watcher.join(30)
    got = json.loads(flood.stdout)
    grew = (max(peak) - idle) / 1024
    worst = max(t for t, _ in latencies)
    print(f"\n8 senders of 50 MB PATCHes without a valid token for {got['seconds']:.1f} s ({got['attempts']} PATCHes, "
          f"replies {got['replies']}, at most {got['most_sent'] / MiB:.1f} MiB out before the daemon closed): daemon "
          f"RSS idle {idle / 1024:.1f} MiB, peak +{grew:.1f} MiB; /healthz {len(latencies)} probes, worst "
          f"{worst * 1000:.1f} ms, median {sorted(t for t, _ in latencies)[len(latencies) // 2] * 1000:.1f} ms; "
          f"with the token: {[(r['reply'], r['sent']) for r in authed]}")
    assert set(got["replies"]) <= {"HTTP/1.1 401 Unauthorized", "closed"}, got
    assert got["replies"].get("HTTP/1.1 401 Unauthorized", 0) >= got["attempts"] // 2, got
    assert "413" in authed[0]["reply"] and "413" in authed[1]["reply"], authed
    assert authed[1]["sent"] < 50 * MiB  # the streamed one was cut short
    assert grew < 50, f"daemon RSS grew {grew:.1f} MiB"
    assert all(code == 200 for _, code in latencies) and worst < 0.1, f"/healthz took {worst * 1000:.0f} ms"
    assert config(d.url) == before
