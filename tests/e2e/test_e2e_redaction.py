"""End to end: credentials in a source URL never leave the daemon.

The source is ``http://user:PASSWORD@127.0.0.1:PORT/data/`` served by a small HTTP server with Range support (what
fsspec's HTTP filesystem needs), one of whose files is garbage (so it shows in the quarantine). The password must
not appear in ``/v1/status``, ``/v1/shards``, ``/v1/quarantine``, a manifest, or the daemon's log — while the
daemon still reads the files with it.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any, Callable

import pytest
from http_source import SECRET

from samplecache_service.config.redact import RedactingFilter, redact

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
    import logging
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "opening %s", (f"http://u:{SECRET}@h/",), None)
    RedactingFilter().filter(rec)
    assert SECRET not in rec.getMessage() and "***@h" in rec.getMessage()
