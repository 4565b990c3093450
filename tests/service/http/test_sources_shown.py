"""Each named source shows in /metrics (``samplecache_source_*`` families, labelled ``source``), on the status page
(a row per source, a line per source in the ``source_bytes`` chart) and in ``samplecache status`` (a table), with
the numbers ``GET /v1/sources`` gives. One in-process daemon over local Parquet folders: ``web`` and ``code`` are
cached whole, ``gone`` does not exist (a remote error, while the others sample)."""

from __future__ import annotations

import argparse
import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from samplecache_service.cli import status as cli
from samplecache_service.config.settings import Settings
from samplecache_service.daemon import Daemon
from samplecache_service.http.app import create_app
from samplecache_service.http.metrics import SAMPLER_STATES, SOURCE_FAMILIES, source_families
from samplecache_service.http.models import SourceStatus

ROWS = {"web": (3, 1000), "code": (1, 1000)}  # files, rows per file
SHARES = {"web": 0.5, "code": 0.3, "gone": 0.2}
BUDGET = 4_000_000  # every source fits its share: sampling completes and the numbers settle


def _write(d: Path, files: int, rows: int, first_id: int) -> None:
    d.mkdir(parents=True)
    for i in range(files):
        ids = np.arange(first_id + i * rows, first_id + (i + 1) * rows, dtype=np.int64)
        vec = np.random.default_rng(first_id + i).random((rows, 64), dtype=np.float32)
        pq.write_table(pa.table({"id": ids, "v": pa.FixedSizeListArray.from_arrays(vec.ravel(), 64)}),
                       d / f"part-{i}.parquet", row_group_size=250)


def _until(pred: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, TestClient]]:
    root = tmp_path_factory.mktemp("sources-shown")
    for i, (name, (files, rows)) in enumerate(ROWS.items()):
        _write(root / "data" / name, files, rows, i * 10**6)
    settings = Settings(cache_dir=root / "cache", samplers=2, discover_interval=3600, retry_seconds=0.5,
                        min_free_disk=0, unit_bytes="64KiB", pacing="off", max_bytes=BUDGET,
                        sources={n: {"url": f"file://{root / 'data' / n}/"} for n in SHARES}, share=SHARES)
    d = Daemon(settings)
    try:
        d.check_remote()
        d.start()
        _until(lambda: all(d.catalog.resident(n).rows == f * r for n, (f, r) in ROWS.items())
               and all(s.scheduler.complete for n, s in d.sources.items() if n in ROWS), 60,
               "web and code to be cached whole")
        for _ in range(3):  # points of the history, for the per-source chart
            d.recorder.step()
    except BaseException:
        d.stop()
        raise
    with TestClient(create_app(settings, d)) as client:  # the app's lifespan stops the daemon
        yield d, client


def _sources(client: TestClient) -> dict[str, dict[str, Any]]:
    r = client.get("/v1/sources")
    assert r.status_code == 200, r.text
    return {s["name"]: s for s in r.json()}


# ----------------------------------------------------------------------------------------------- /metrics
def _scrape(client: TestClient) -> dict[str, Any]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def _by_source(family: Any, suffix: str = "") -> dict[str, float]:
    return {s.labels["source"]: s.value for s in family.samples if s.name == family.name + suffix}


def test_metrics_have_each_sources_series(served: tuple[Daemon, TestClient]) -> None:
    d, client = served
    before = _sources(client)
    m = _scrape(client)
    after = _sources(client)
    assert set(before) == set(SHARES)

    # the daemon-wide families are still there, beside the per-source ones
    for name in ("samplecache_cache_bytes", "samplecache_budget_bytes", "samplecache_samples",
                 "samplecache_remote_errors", "samplecache_quarantined_files", "samplecache_sampler_state"):
        assert name in m, name
    cache_bytes = m["samplecache_cache_bytes"].samples[0].value

    # every source has a series in every family, but coverage before its source is discovered
    for kind, name, _, _ in SOURCE_FAMILIES:
        family = m[f"samplecache_{name}"]
        assert family.type == kind and family.documentation, name
        want = set(ROWS) if "coverage" in name else set(SHARES)
        got = _by_source(family, "_total" if kind == "counter" else "")
        assert set(got) == want, (name, got)

    def g(name: str) -> dict[str, float]:
        return _by_source(m[f"samplecache_{name}"])

    assert g("source_bytes") == {n: s["bytes"] for n, s in after.items()}
    assert g("source_bytes")["web"] > g("source_bytes")["code"] > 0 == g("source_bytes")["gone"]
    assert sum(g("source_bytes").values()) == cache_bytes
    assert g("source_samples") == {"web": 3000, "code": 1000, "gone": 0}
    assert g("source_shards") == {n: s["shards"] for n, s in after.items()}
    assert g("source_budget_bytes") == {n: int(BUDGET * f) for n, f in SHARES.items()}
    assert g("source_share_ratio") == pytest.approx(SHARES)
    assert g("source_up") == {"web": 1, "code": 1, "gone": 0}
    assert g("source_ready") == {"web": 1, "code": 1, "gone": 0}
    assert g("source_coverage_row_ratio") == {"web": 1.0, "code": 1.0}
    assert g("source_coverage_passes") == {n: after[n]["coverage"]["cycle"] for n in ROWS}
    assert g("source_quarantined_files") == {"web": 0, "code": 0, "gone": 0}
    errors = _by_source(m["samplecache_source_remote_errors"], "_total")
    assert errors["web"] == errors["code"] == 0
    assert before["gone"]["remote_errors"] <= errors["gone"] <= after["gone"]["remote_errors"] and errors["gone"] >= 1
    read = _by_source(m["samplecache_source_discovery_read_bytes"], "_total")
    assert read["web"] > 0 and read["gone"] == 0
    state = {(s.labels["source"], s.labels["state"]): s.value for s in m["samplecache_source_state"].samples}
    assert len(state) == len(SHARES) * len(SAMPLER_STATES)
    assert state[("gone", "remote error")] == 1 and state[("web", "remote error")] == 0
    for name in SHARES:  # exactly one state each, the one /v1/sources says
        assert sum(v for (n, _), v in state.items() if n == name) == 1
        assert state[(name, after[name]["state"])] == 1


def test_source_label_values_are_escaped() -> None:
    odd = 'we"b\\x\nz'
    plain = SourceStatus(name="code", url="file:///c/", share=0.5, max_bytes=100, bytes=40, samples=4, shards=1,
                         state="sampling", coverage=None, remote_bytes=0, remote_errors=0, last_error=None,
                         quarantined=0, ready=True)
    sources = [plain, plain.model_copy(update={"name": odd, "bytes": 7, "problem": "remote error: gone"})]

    class Sources:
        def collect(self) -> Any:
            return source_families(sources)

    registry = CollectorRegistry()
    registry.register(Sources())
    text = generate_latest(registry).decode()
    assert 'samplecache_source_bytes{source="we\\"b\\\\x\\nz"} 7.0' in text, text
    assert "\nz" not in text.replace("\\nz", ""), "a raw newline inside a label value"
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    assert _by_source(parsed["samplecache_source_bytes"]) == {"code": 40, odd: 7}
    assert _by_source(parsed["samplecache_source_up"]) == {"code": 1, odd: 0}
    assert "samplecache_source_coverage_row_ratio" not in parsed  # never claimed before discovery


# ----------------------------------------------------------------------------------------------- the page
class _Rows(HTMLParser):
    """The sources table's rows: name -> {data-metric: data-value}, and the problem text; the chart figures."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self.problems: dict[str, str] = {}
        self.charts: dict[str, int] = {}
        self.polylines: dict[str, int] = {}
        self._row: str | None = None
        self._chart: str | None = None
        self._in_problem = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-source") is not None:
            self._row = a["data-source"]
            self.rows[self._row or ""] = {}
        elif tag == "figure":
            self._chart = a.get("data-chart")
            self.charts[self._chart or ""] = int(a.get("data-points") or 0)
        elif tag == "polyline" and self._chart:
            self.polylines[self._chart] = self.polylines.get(self._chart, 0) + 1
        if self._row is not None and a.get("data-metric"):
            self.rows[self._row][a["data-metric"] or ""] = a.get("data-value") or ""
        if self._row is not None and "data-problem" in a:
            self._in_problem = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        elif tag == "figure":
            self._chart = None
        elif tag == "span":
            self._in_problem = False

    def handle_data(self, data: str) -> None:
        if self._in_problem and self._row is not None:
            self.problems[self._row] = self.problems.get(self._row, "") + data


def test_the_status_page_has_a_row_and_a_line_per_source(served: tuple[Daemon, TestClient]) -> None:
    d, client = served
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    sources = _sources(client)
    page = _Rows()
    page.feed(r.text)
    assert list(page.rows) == list(SHARES), page.rows
    assert '<table data-table="sources" data-rows="3">' in r.text
    for name, s in sources.items():
        row = page.rows[name]
        assert row["source_bytes"] == str(s["bytes"]) and row["source_max_bytes"] == str(s["max_bytes"]), row
        assert row["source_samples"] == str(s["samples"]) and row["source_shards"] == str(s["shards"]), row
        assert row["source_share"] == str(s["share"]) and row["source_state"] == s["state"], row
        assert s["url"] in r.text
    assert page.rows["gone"]["source_state"] == "remote error"
    assert set(page.problems) == {"gone"} and "does not exist" in page.problems["gone"], page.problems
    # the chart: a line per source over the history's points (and the page's point for now)
    assert page.charts.get("source_bytes", 0) >= 3, page.charts
    assert page.polylines["source_bytes"] == len(SHARES)
    legend = re.search(r'data-chart="source_bytes".*?<ul class="legend">(.*?)</ul>', r.text, re.S)
    assert legend is not None and re.findall(r"</span>([^<]+)</li>", legend.group(1)) == list(SHARES)
    assert "3 sources <code>web</code>, <code>code</code>, <code>gone</code>" in r.text


def test_the_history_records_each_sources_bytes(served: tuple[Daemon, TestClient]) -> None:
    d, _ = served
    last = d.history.points()[-1]
    assert dict(last.sources) == {n: d.catalog.resident(n).bytes for n in ROWS}  # gone holds nothing
    assert last.source_bytes("web") == d.catalog.resident("web").bytes > 0 and last.source_bytes("gone") == 0


# ----------------------------------------------------------------------------------------------- the CLI
def test_samplecache_status_prints_a_table_of_the_sources(served: tuple[Daemon, TestClient],
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    d, client = served
    status = client.get("/v1/status").json()
    asked: list[str] = []

    def get(url: str) -> Any:
        asked.append(url)
        return status

    monkeypatch.setattr(cli, "_get", get)
    assert cli.cmd_status(argparse.Namespace(url="http://daemon:8750/", json=False)) == 0
    assert asked == ["http://daemon:8750/v1/status"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("  ")[0] == "source" and any(ln.startswith("resident ") for ln in lines)  # as before
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["name", "share"])
    assert lines[head - 1] == "" and lines[head].split() == ["name", "share", "resident", "samples", "shards",
                                                            "state", "problem"]
    table = {ln.split()[0]: ln for ln in lines[head + 1:]}
    assert list(table) == list(SHARES)
    by_name = {s["name"]: s for s in status["sources"]}
    for name, ln in table.items():
        s = by_name[name]
        assert f"{100 * SHARES[name]:.1f}%" in ln
        assert f"{cli.human(s['bytes'])} of {cli.human(s['max_bytes'])}" in ln, ln
        assert re.search(rf"\s{s['samples']}\s+{s['shards']}\s+{re.escape(s['state'])}\s", ln), ln
        why = " ".join(str(s["problem"] or s["reason"] or "-").split())
        assert ln.endswith(f"  {why}"), (ln, why)
    assert "remote error" in table["gone"] and "does not exist" in table["gone"], table["gone"]
    # the columns line up: each row's state starts where the head's does
    col = lines[head].index("state")
    assert all(ln[col:].split()[0] in ("sampling", "paused", "remote", "discovering") for ln in table.values())

    # --json: the status as the daemon sent it, sources and all
    assert cli.cmd_status(argparse.Namespace(url="http://daemon:8750", json=True)) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["sources"] == status["sources"] and [s["name"] for s in shown["sources"]] == list(SHARES)


def test_the_daemon_wide_status_speaks_for_every_source(served: tuple[Daemon, TestClient]) -> None:
    """With several sources the top-level sampler reason and last error name each source's, and remote_errors adds
    them up: the failing source shows even though it is not the first."""
    _, client = served
    status = client.get("/v1/status").json()
    shown = _sources(client)
    assert shown["gone"]["state"] == "remote error" and shown["gone"]["last_error"], shown["gone"]
    assert status["remote_errors"] == sum(s["remote_errors"] for s in shown.values()) > 0
    assert f"gone: {shown['gone']['last_error']}" in (status["last_error"] or ""), status["last_error"]
    for name, s in shown.items():
        if s["reason"]:
            assert f"{name}: {s['reason']}" in status["sampler"]["reason"], status["sampler"]
