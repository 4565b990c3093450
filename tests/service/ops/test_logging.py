"""Log lines (service/samplecache_service/ops/logs.py): the JSON format's stable keys, one line per record,
credentials masked, every event named and documented in docs/logging.md; and a real daemon that logs only JSON
with ``--log-format json``."""

from __future__ import annotations

import ast
import io
import json
import logging
import re
import subprocess
import sys
import time
import urllib.request
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from http_source import SECRET
from paths import REPO

from samplecache_service.ops.logs import (
    CONTEXT_KEYS,
    DEFAULT_EVENTS,
    FALLBACK_EVENT,
    TEXT_FORMAT,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    rfc3339,
    set_level,
)

DOC = REPO / "docs" / "logging.md"
ALWAYS = ("ts", "level", "logger", "event", "msg")
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def record(msg: str, *args: Any, name: str = "samplecache.daemon", level: int = logging.INFO,
           exc: Any = None, **extra: Any) -> logging.LogRecord:
    rec = logging.LogRecord(name, level, __file__, 1, msg, args, exc)
    rec.__dict__.update(extra)
    return rec


def as_json(rec: logging.LogRecord) -> dict[str, Any]:
    line = JsonFormatter().format(rec)
    assert "\n" not in line and "\r" not in line, line
    out = json.loads(line)
    assert isinstance(out, dict)
    return out


# ----------------------------------------------------------------------------- the formatter
def test_a_json_line_has_the_stable_keys_and_the_known_context() -> None:
    rec = record("shard %d ingested", 7, event="shard_ingested", shard=7, unit=2, path="s3://b/f.parquet", job=None)
    out = as_json(rec)
    assert list(out)[:5] == list(ALWAYS)
    assert out["level"] == "info" and out["logger"] == "samplecache.daemon" and out["event"] == "shard_ingested"
    assert out["msg"] == "shard 7 ingested"
    assert out["shard"] == 7 and out["unit"] == 2 and out["path"] == "s3://b/f.parquet"
    assert "job" not in out and "epoch" not in out, "an unknown context key is left out, not null"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", out["ts"]), out["ts"]
    assert abs(datetime.fromisoformat(out["ts"].replace("Z", "+00:00")).timestamp() - time.time()) < 60


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert rfc3339(0.0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1700000000.25) == "2023-11-14T22:13:20.250Z"


def test_newlines_and_tracebacks_stay_on_one_line() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        exc = sys.exc_info()
    out = as_json(record("first line\nsecond line", event="thread_failed", level=logging.ERROR, exc=exc))
    assert out["msg"] == "first line\nsecond line"
    assert out["exc"].startswith("Traceback") and "ValueError: bad\nvalue" in out["exc"]
    assert out["level"] == "error"


def test_records_without_an_event_get_their_loggers_default() -> None:
    access = record('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "POST", "/v1/samplers/pause", "1.1", 200,
                    name="uvicorn.access")
    out = as_json(access)
    assert out["event"] == "http_request" and out["method"] == "POST" and out["status"] == 200
    assert out["path"] == "/v1/samplers/pause"
    assert as_json(record("Started server process [%d]", 1, name="uvicorn.error"))["event"] == "server"
    assert as_json(record("found credentials", name="botocore.credentials"))["event"] == FALLBACK_EVENT


def test_credentials_are_masked_in_message_context_and_traceback() -> None:
    url = f"http://reader:{SECRET}@127.0.0.1:1/data/part-0.parquet"
    try:
        raise OSError(f"cannot open {url}")
    except OSError:
        exc = sys.exc_info()
    rec = record("quarantined %s", url, event="file_quarantined", path=url, exc=exc, level=logging.WARNING)
    line = JsonFormatter().format(rec)
    assert SECRET not in line, line
    out = json.loads(line)
    assert out["path"] == "http://***@127.0.0.1:1/data/part-0.parquet"
    assert "***@127.0.0.1" in out["msg"] and "***@127.0.0.1" in out["exc"]
    q = as_json(record("GET %s", "/v1/x?token=abc123&a=1"))
    assert "abc123" not in q["msg"] and "token=***" in q["msg"]
    text = TextFormatter(TEXT_FORMAT).format(record("quarantined %s", url, exc=exc))
    assert SECRET not in text and text.count("***@127.0.0.1") == 2, text  # the message and the traceback


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    """The root logger, restored afterwards (handlers, levels, warnings capture)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {n: logging.getLogger(n).level for n in ("uvicorn.error", "uvicorn.access", "uvicorn.asgi")}
    try:
        yield root
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
                h.close()
        root.setLevel(level)
        for n, lv in levels.items():
            logging.getLogger(n).setLevel(lv)
        logging.captureWarnings(False)


def test_configure_logging_replaces_only_its_own_handler_and_set_level_changes_the_level(
        root_logging: logging.Logger) -> None:
    others = list(root_logging.handlers)  # pytest's capture handlers: they stay
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "text", first)
    configure_logging("warning", "json", second)
    assert [h for h in root_logging.handlers if h not in others and h.__class__.__name__ == "_Handler"] != []
    assert len(root_logging.handlers) == len(others) + 1, root_logging.handlers
    log = logging.getLogger("samplecache.test")
    log.info("hidden at warning", extra={"event": "x"})
    log.warning("shown", extra={"event": "job_started", "job": "j1"})
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a python warning", UserWarning)
    set_level("debug")
    assert root_logging.level == logging.DEBUG and logging.getLogger("uvicorn.error").level == logging.DEBUG
    log.debug("now shown", extra={"event": "y"})
    lines = [json.loads(ln) for ln in second.getvalue().splitlines()]
    assert first.getvalue() == ""
    assert [(ln["event"], ln["msg"]) for ln in lines if ln["logger"] == "samplecache.test"] == [
        ("job_started", "shown"), ("y", "now shown")]
    assert lines[0]["job"] == "j1"
    assert any(ln["event"] == "python_warning" and "a python warning" in ln["msg"] for ln in lines), lines
    with pytest.raises(ValueError):
        set_level("loud")
    with pytest.raises(ValueError):
        configure_logging("info", "xml", io.StringIO())


# ----------------------------------------------------------------------------- every event named and documented
def log_calls() -> Iterator[tuple[str, int, ast.Call]]:
    for path in sorted((REPO / "service").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LOG_METHODS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "log"):
                yield path.name, node.lineno, node


def events_in_code() -> set[str]:
    names = set()
    for path in sorted((REPO / "service").rglob("*.py")):
        names |= set(re.findall(r'"event": "([^"]+)"', path.read_text()))
    return names | set(DEFAULT_EVENTS.values()) | {FALLBACK_EVENT}


def documented_events() -> dict[str, str]:
    section = DOC.read_text().split("## Events", 1)[1]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\| `([a-z_]+)` \| ([^|]+) \|", section, re.M)}


def test_every_log_call_in_the_daemon_names_its_event() -> None:
    found = list(log_calls())
    assert len(found) > 30, "the AST walk found too few log calls to be looking at the right thing"
    missing = []
    for name, line, call in found:
        extra = next((k.value for k in call.keywords if k.arg == "extra"), None)
        if isinstance(extra, ast.Dict):
            keys = [k.value for k in extra.keys if isinstance(k, ast.Constant)]
            if "event" in keys:
                continue
        elif isinstance(extra, ast.Name):  # a dict built just before (scheduler's ``failed``)
            continue
        missing.append(f"{name}:{line}")
    assert not missing, f"log calls without extra={{'event': ...}}: {missing}"


def test_every_event_is_in_the_table_of_docs_logging_md_and_no_other() -> None:
    code, doc = events_in_code(), documented_events()
    assert "shard_ingested" in code and "epoch_sealed" in code
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", e) for e in code), sorted(code)
    assert not code - set(doc), f"events missing from the table in {DOC.name}: {sorted(code - set(doc))}"
    assert not set(doc) - code, f"events in {DOC.name} that the code never logs: {sorted(set(doc) - code)}"


def test_every_context_key_is_documented() -> None:
    keys = DOC.read_text().split("## Keys", 1)[1].split("## Events", 1)[0]
    for key in (*ALWAYS, *CONTEXT_KEYS, "exc"):
        assert f"`{key}`" in keys, f"key {key} is not documented in {DOC.name}"


# ----------------------------------------------------------------------------- a real daemon
def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of the daemon's output as a JSON object (fails on the first line that is not one)."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"line {n} of {path.name} is not JSON: {line[:300]!r}") from None
        assert isinstance(obj, dict) and all(k in obj for k in ALWAYS), f"line {n} lacks a stable key: {line[:300]}"
        assert isinstance(obj["event"], str) and obj["event"], line
        out.append(obj)
    return out


def call(url: str, method: str, headers: dict[str, str], body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={**headers, **({"Content-Type": "application/json"} if data else {})})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
        return json.loads(raw) if raw else None


@pytest.mark.e2e
def test_a_daemon_with_log_format_json_writes_only_json_lines(daemon: Any, typed_dataset: Any, s3: Any,
                                                               get: Callable[..., Any],
                                                               until: Callable[..., Any]) -> None:
    token = "tok-" + "7" * 40
    env = {k: v for k, v in s3.env().items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    options = json.dumps({"key": s3.key, "secret": s3.secret})  # the S3 secret only in a secret setting
    d = daemon(env=env, extra=["--log-format", "json", "--log-level", "debug", "--token", token,
                               "--storage-options", options])
    auth = {"Authorization": f"Bearer {token}"}
    until(lambda: get(d.url + "/v1/status").json()["samples"] >= typed_dataset.rows, 60, "every row cached")
    call(d.url + "/v1/jobs", "POST", auth, {"name": "logjob", "run": "0123abcd"})
    assert get(d.url + "/v1/epochs/0").status == 200
    lease = call(d.url + "/v1/epochs/0/leases", "POST", auth, {"ttl": 0.5, "holder": "test_logging"})
    call(d.url + "/v1/samplers/pause", "POST", auth)
    until(lambda: '"lease_expired"' in d.log_path.read_text(), 20, "the lease to expire")
    assert daemon.stop(d).code == 0

    lines = json_lines(d.log_path)
    events = {ln["event"] for ln in lines}
    ingested = [ln for ln in lines if ln["event"] == "shard_ingested"]
    assert len(ingested) >= typed_dataset.row_groups, f"{len(ingested)} shard_ingested lines"
    for ln in ingested:
        assert isinstance(ln["shard"], int) and isinstance(ln["unit"], int) and ln["path"].endswith(".parquet"), ln
        assert ln["rows"] > 0 and ln["bytes"] > 0 and ln["logger"] == "samplecache.daemon" and ln["level"] == "info"
    assert sum(ln["rows"] for ln in ingested) == typed_dataset.rows
    assert len({ln["shard"] for ln in ingested}) == len(ingested)
    sealed = [ln for ln in lines if ln["event"] == "epoch_sealed"]
    assert [(ln["epoch"], ln["rows"]) for ln in sealed] == [(0, typed_dataset.rows)], sealed
    assert any(ln["event"] == "job_started" and ln["job"] == "logjob" for ln in lines)
    expired = [ln for ln in lines if ln["event"] == "lease_expired"]
    assert expired and expired[0]["lease"] == lease["id"] and expired[0]["epoch"] == 0, expired
    assert "source_planned" in events
    server = [ln for ln in lines if ln["logger"].startswith("uvicorn")]
    assert any(ln["event"] == "server" and "Uvicorn running on" in ln["msg"] for ln in server), server[:5]
    assert any(ln["event"] == "server" and "Shutting down" in ln["msg"] for ln in server), server[-5:]
    access = [ln for ln in server if ln["event"] == "http_request"]
    assert any(ln["method"] == "POST" and ln["path"] == "/v1/samplers/pause" and ln["status"] == 200
               for ln in access), access[-5:]
    text = d.log_path.read_text()
    for secret in (token, s3.secret):
        assert secret not in text, "a secret shows in the daemon's log"


@pytest.mark.e2e
def test_json_logs_mask_the_password_of_the_source_url(daemon: Any, http_source: str,  # noqa: F811
                                                       get: Callable[..., Any], until: Callable[..., Any]) -> None:
    d = daemon(http_source, samplers=1, extra=["--log-format", "json", "--max-bytes", "64MiB",
                                               "--min-free-disk", "1MiB"])
    until(lambda: get(d.url + "/v1/status").json()["samples"] >= 600, 60, "every good row cached")
    until(lambda: '"file_quarantined"' in d.log_path.read_text(), 30, "the garbage file quarantined")
    assert daemon.stop(d).code == 0
    text = d.log_path.read_text()
    assert SECRET not in text, "the source URL's password shows in the JSON log"
    lines = json_lines(d.log_path)
    quarantined = [ln for ln in lines if ln["event"] == "file_quarantined"]
    assert quarantined and quarantined[0]["path"].endswith("garbage.parquet"), quarantined
    assert "***@127.0.0.1" in quarantined[0]["path"] and quarantined[0]["error_class"] in ("corrupt", "schema")
    ingested = [ln for ln in lines if ln["event"] == "shard_ingested"]
    assert ingested and all("***@127.0.0.1" in ln["path"] for ln in ingested), ingested[:2]


def test_a_daemon_that_cannot_start_says_why_in_one_json_line(tmp_path: Path) -> None:
    source = f"file://{tmp_path}/missing"
    r = subprocess.run([sys.executable, "-m", "samplecache_service", "serve", "--source", source, "--cache-dir",
                        str(tmp_path / "cache"), "--port", "0", "--log-format", "json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    (tmp_path / "err.log").write_text(r.stdout + r.stderr)
    lines = json_lines(tmp_path / "err.log")
    failed = [ln for ln in lines if ln["event"] == "startup_failed"]
    assert len(failed) == 1 and failed[0]["level"] == "error" and "does not exist" in failed[0]["msg"], lines
    # the warning before it says what happens next: no retry, the daemon does not start
    listing = [ln for ln in lines if ln["event"] == "discovery_failed"]
    assert len(listing) == 1 and "retrying" not in listing[0]["msg"], listing
    assert "does not start: serve exits 1" in listing[0]["msg"], listing
