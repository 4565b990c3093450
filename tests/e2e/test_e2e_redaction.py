"""End to end: credentials in a source URL never leave the daemon.

The source is ``http://user:PASSWORD@127.0.0.1:PORT/data/`` served by a small HTTP server with Range support (what
fsspec's HTTP filesystem needs), one of whose files is garbage (so it shows in the quarantine). The password must
not appear in ``/v1/status``, ``/v1/shards``, ``/v1/quarantine``, a manifest, or the daemon's log — while the
daemon still reads the files with it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from types import SimpleNamespace
from typing import Any, Callable

import pytest
from http_source import SECRET

from samplecache_service.config.redact import RedactingFilter, redact
from samplecache_service.daemon import Daemon

pytestmark = pytest.mark.e2e

def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()  # type: ignore[no-any-return]


def test_credentials_in_the_source_url_are_never_shown(daemon: Callable[..., Any], http_source: str,
                                                        until: Callable[..., Any]) -> None:
    d = daemon(http_source, samplers=1, extra=["--max-bytes", "64MiB", "--min-free-disk", "1MiB"])
    until(lambda: json.loads(fetch(d.url + "/v1/status"))["samples"] >= 600, 60, "every good row cached")
    shown = {name: fetch(d.url + path) for name, path in [
        ("status", "/v1/status"), ("shards", "/v1/shards?limit=1000"), ("quarantine", "/v1/quarantine"),
        ("manifest", "/v1/epochs/0"), ("compact manifest", "/v1/epochs/0?format=compact"),
        ("config", "/v1/config"), ("jobs", "/v1/jobs")]}
    quarantine = json.loads(shown["quarantine"])
    assert quarantine["total"] == 1 and quarantine["files"][0]["path"].endswith("garbage.parquet"), quarantine
    assert "***@" in quarantine["files"][0]["path"]
    shards = json.loads(shown["shards"])["shards"]
    assert shards and all("***@127.0.0.1" in s["path"] for s in shards), shards[:2]
    assert "reader" not in json.loads(shown["status"])["source"]
    log = d.log_path.read_text()
    assert "garbage.parquet" in log  # the quarantine was logged...
    for name, body in [*shown.items(), ("log", log.encode())]:
        assert SECRET.encode() not in body, f"the password shows in the {name}"


def test_redact_masks_userinfo_and_secret_query_parameters() -> None:
    assert redact("s3://bucket/x") == "s3://bucket/x"
    assert redact(f"http://u:{SECRET}@h:1/p?a=1") == "http://***@h:1/p?a=1"
    assert redact("see https://tok@example.com/a and ftp://x:y@z/") == "see https://***@example.com/a and ftp://***@z/"
    assert redact("https://h/o?X-Amz-Signature=abc&b=2") == "https://h/o?X-Amz-Signature=***&b=2"
    # percent-encoded, as a request path holds it (uvicorn's access log)
    assert redact(f"DELETE /q/http%3A//u%3A{SECRET}%40h%3A1/p") == "DELETE /q/http%3A//***%40h%3A1/p"
    assert redact(f"/q/https%3a%2F%2Fu%3A{SECRET}%40h%2Fp") == "/q/https%3a%2F%2F***%40h%2Fp"
    assert redact("/q/s3%3A//bucket/key%40x") == "/q/s3%3A//bucket/key%40x"
    import logging
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "opening %s", (f"http://u:{SECRET}@h/",), None)
    RedactingFilter().filter(rec)
    assert SECRET not in rec.getMessage() and "***@h" in rec.getMessage()


def delete(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method="DELETE", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_quarantined_file_is_released_by_its_listed_path_or_id(daemon: Callable[..., Any], http_source: str,
                                                                 until: Callable[..., Any]) -> None:
    # debug: uvicorn's access log is on, and it writes each request's path percent-encoded
    d = daemon(http_source, samplers=1, extra=["--max-bytes", "64MiB", "--min-free-disk", "1MiB",
                                               "--log-level", "debug"])
    q = until(lambda: (lambda q: q if q["total"] == 1 else None)(json.loads(fetch(d.url + "/v1/quarantine"))), 60,
              "the garbage file in quarantine")
    [entry] = q["files"]
    assert "***@" in entry["path"] and entry["path"].endswith("garbage.parquet") and entry["id"], entry
    real = http_source + "garbage.parquet"
    replies = []
    # the path as listed (masked; as sent and percent-encoded), its id, and the real path each release it; it is
    # garbage, so it is read again and quarantined again, and the next release finds it there
    for name in (entry["path"], urllib.parse.quote(entry["path"], safe=""), entry["id"], real,
                 urllib.parse.quote(real, safe="")):
        code, body = delete(f"{d.url}/v1/quarantine/{name}", d.headers)
        replies.append(body)
        assert code == 200, (name, code, body)
        got = json.loads(body)
        assert got["released"] and (got["id"], got["path"]) == (entry["id"], entry["path"]), got
    code, body = delete(f"{d.url}/v1/quarantine/{http_source}nothing.parquet", d.headers)
    replies.append(body)
    assert code == 404 and b"no quarantined file" in body and b"***@" in body, (code, body)
    until(lambda: (lambda f: f if f and not f[0]["released"] else None)(
        json.loads(fetch(d.url + "/v1/quarantine"))["files"]), 30, "the still-bad file quarantined again")
    log = d.log_path.read_text()
    assert "/v1/quarantine/" in log, "the requests were not logged"
    for name, body in [*((f"reply {i}", b) for i, b in enumerate(replies)), ("log", log.encode())]:
        assert SECRET.encode() not in body, f"the password shows in the {name}"


def test_the_sampler_reason_is_masked() -> None:
    # the reason /v1/status shows may name the last error: a remote path, with the source's password in it
    scheduler = SimpleNamespace(paused_reason=f"waiting to retry 1 unit(s) after failures (backoff; last error: "
                                              f"http://reader:{SECRET}@h/d/p.parquet row group 0: 403 Forbidden)")
    shown = Daemon.paused_reason.fget(SimpleNamespace(scheduler=scheduler))  # type: ignore[attr-defined]
    assert SECRET not in shown and "http://***@h/d/p.parquet row group 0" in shown, shown
