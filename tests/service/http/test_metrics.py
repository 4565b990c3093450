"""GET /metrics end to end: a real ``samplecache serve`` subprocess ingesting from the real S3 server of
conftest.py, scraped over HTTP and parsed with ``prometheus_client.parser``. The numbers agree with /v1/status,
counters grow while the daemon ingests, requests land in the HTTP histogram under their route template, every
family follows the naming conventions, and the Grafana dashboard names only metrics a live scrape has.

The daemons churn: the typed dataset (12 units of ~41 KB) under a budget of ~4 shards, pacing off, so shards
are ingested and evicted all the time."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterator

import pytest
from conftest import Daemons, ServedDaemon, TypedDataset
from paths import REPO
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from samplecache_tools.s3server import S3Server

pytestmark = pytest.mark.e2e

BUDGET = 170_000  # ~4 shards of the typed dataset: sampling never completes, shards are evicted all the time
CHURN = ["--pacing", "off", "--max-bytes", str(BUDGET)]
DASHBOARD = REPO / "deploy" / "grafana" / "samplecache-dashboard.json"
TYPES = {  # family (as the parser names it: counters without _total) -> type
    "samplecache_build_info": "gauge", "samplecache_start_time_seconds": "gauge",
    "samplecache_cache_bytes": "gauge", "samplecache_budget_bytes": "gauge", "samplecache_manifest_bytes": "gauge",
    "samplecache_shards": "gauge", "samplecache_samples": "gauge", "samplecache_disk_free_bytes": "gauge",
    "samplecache_min_free_disk_bytes": "gauge", "samplecache_evictions": "counter",
    "samplecache_evicted_bytes": "counter", "samplecache_ingested_shards": "counter",
    "samplecache_ingested_samples": "counter", "samplecache_ingested_bytes": "counter",
    "samplecache_ingest_seconds": "histogram", "samplecache_lmdb_commits": "counter",
    "samplecache_remote_read_bytes": "counter", "samplecache_remote_sampler_bytes": "counter",
    "samplecache_remote_needed_bytes": "counter", "samplecache_pacing_allowance_bytes": "gauge",
    "samplecache_sampler_state": "gauge", "samplecache_sampler_processes": "gauge",
    "samplecache_sampler_tasks": "gauge", "samplecache_sampler_restarts": "counter",
    "samplecache_sampler_start_failures": "counter",
    "samplecache_sampler_errors": "counter",
    "samplecache_sampler_units_given_up": "counter", "samplecache_remote_errors": "counter",
    "samplecache_quarantined_files": "gauge", "samplecache_coverage_row_ratio": "gauge",
    "samplecache_coverage_unit_ratio": "gauge", "samplecache_coverage_passes": "gauge",
    "samplecache_remote_units": "gauge", "samplecache_remote_rows": "gauge", "samplecache_health_problems": "gauge",
    "samplecache_thread_failures": "counter", "samplecache_epochs_sealed": "counter",
    "samplecache_epochs_kept": "gauge", "samplecache_pinned_epochs": "gauge", "samplecache_leases": "gauge",
    "samplecache_jobs": "gauge",
    "samplecache_http_request_duration_seconds": "histogram", "samplecache_lmdb_map_used_bytes": "gauge",
    "samplecache_lmdb_map_size_bytes": "gauge", "samplecache_lmdb_file_bytes": "gauge",
    "samplecache_lmdb_readers": "gauge", "samplecache_lmdb_max_readers": "gauge",
    "process_cpu_seconds": "counter", "process_resident_memory_bytes": "gauge", "process_open_fds": "gauge",
}
UNITS = ("bytes", "seconds", "ratio")  # a family that names one of these ends with it (before _total)


# ----------------------------------------------------------------------------------------------- helpers
class Scrape:
    """One parsed scrape: families by name, and sample lookups."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def samples(self) -> Iterator[Sample]:
        for f in self.families.values():
            yield from f.samples

    def value(self, name: str, **labels: str) -> float:
        """The value of the one sample ``name`` with ``labels`` (a subset of its labels)."""
        got = [s.value for s in self.samples() if s.name == name and labels.items() <= s.labels.items()]
        assert len(got) == 1, f"{len(got)} samples {name}{labels}"
        return float(got[0])

    def total(self, name: str) -> float:
        """The sum of every sample ``name`` (over all its labels)."""
        return sum(float(s.value) for s in self.samples() if s.name == name)

    def routes(self) -> set[str]:
        return {s.labels["route"] for s in self.samples()
                if s.name == "samplecache_http_request_duration_seconds_count"}


def scrape(d: ServedDaemon) -> Scrape:
    with urllib.request.urlopen(d.url + "/metrics", timeout=30) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return Scrape(r.read().decode())


def status(d: ServedDaemon) -> Any:
    with urllib.request.urlopen(d.url + "/v1/status", timeout=30) as r:
        return json.loads(r.read())


def call(d: ServedDaemon, method: str, path: str, body: Any = None, token: bool = True) -> int:
    data = json.dumps(body).encode() if body is not None else None
    headers = {**(d.headers if token else {}), **({"Content-Type": "application/json"} if data else {})}
    req = urllib.request.Request(d.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def settled(d: ServedDaemon, until: Callable[..., Any]) -> tuple[Any, Scrape]:
    """A scrape between two equal status snapshots of a paused daemon (nothing in flight, nothing changing)."""
    def attempt() -> tuple[Any, Scrape] | None:
        before = status(d)
        m = scrape(d)
        after = status(d)
        keys = ("bytes", "shards", "samples", "evictions", "remote", "epochs_sealed")
        if before["sampler"]["in_flight"] or any(before[k] != after[k] for k in keys) or \
                before["ingest"]["commits"] != after["ingest"]["commits"]:
            time.sleep(0.2)
            return None
        return after, m
    got: tuple[Any, Scrape] = until(attempt, 30, "a paused daemon whose status stops changing")
    return got


# ----------------------------------------------------------------------------------------------- tests
def test_metrics_agree_with_status_and_counters_grow_while_ingesting(daemon: Any, until: Any) -> None:
    d = daemon(samplers=1, extra=CHURN)
    until(lambda: status(d)["evictions"] >= 4, 60, "the cache to fill its budget and evict")
    first = scrape(d)
    for name, kind in TYPES.items():
        assert name in first.families, f"no family {name}"
        assert first.families[name].type == kind, (name, first.families[name].type)

    # counters grow while the daemon ingests (and evicts to stay in its budget)
    grows = ("samplecache_ingested_bytes_total", "samplecache_ingested_shards_total",
             "samplecache_ingested_samples_total", "samplecache_remote_read_bytes_total",
             "samplecache_lmdb_commits_total", "samplecache_ingest_seconds_count",
             "samplecache_evictions_total", "samplecache_evicted_bytes_total")
    until(lambda: all(scrape(d).total(n) > first.total(n) for n in grows), 30, f"every one of {grows} to grow")
    m = scrape(d)
    assert m.value("samplecache_evictions_total", reason="ingest") > 0
    assert m.value("samplecache_evictions_total", reason="config") == 0
    assert (m.value("samplecache_sampler_state", state="sampling")
            + m.value("samplecache_sampler_state", state="paused")) == 1

    # paused and settled: every number equals what /v1/status says
    assert call(d, "POST", "/v1/samplers/pause") == 200
    s, m = settled(d, until)
    assert m.value("samplecache_cache_bytes") == s["bytes"] <= BUDGET
    assert m.value("samplecache_budget_bytes") == s["max_bytes"] == BUDGET
    assert m.value("samplecache_shards") == s["shards"] > 0
    assert m.value("samplecache_samples") == s["samples"] > 0
    assert m.total("samplecache_evictions_total") == s["evictions"]
    assert m.value("samplecache_remote_read_bytes_total") == s["remote"]["bytes_read"] > 0
    assert m.value("samplecache_remote_needed_bytes_total") == s["remote"]["needed_bytes"] > 0
    assert m.value("samplecache_remote_sampler_bytes_total") == s["remote"]["sampler_bytes"] > 0
    assert m.value("samplecache_lmdb_commits_total") == s["ingest"]["commits"]
    assert m.value("samplecache_ingest_seconds_count") == m.value("samplecache_ingested_shards_total") > 0
    assert 0 < m.value("samplecache_ingest_seconds_sum") < 60 * m.value("samplecache_ingest_seconds_count")
    assert m.value("samplecache_sampler_restarts_total") == s["sampler"]["restarts"]
    assert m.value("samplecache_sampler_start_failures_total") == s["sampler"]["start_failures"] == 0
    assert m.value("samplecache_sampler_state", state="crash loop") == 0
    assert m.value("samplecache_sampler_processes") == s["sampler"]["processes"] == 1
    assert m.value("samplecache_sampler_state", state="paused") == 1 and s["sampler"]["state"] == "paused"
    assert m.total("samplecache_sampler_errors_total") == sum(s["health"]["unit_failures"].values())
    assert m.value("samplecache_remote_errors_total") == s["remote_errors"]
    assert m.value("samplecache_coverage_row_ratio") == s["coverage"]["row_fraction"]
    assert m.value("samplecache_coverage_passes") == s["coverage"]["cycle"] >= 1
    assert m.value("samplecache_remote_units") == s["coverage"]["units"] == 12
    assert m.value("samplecache_lmdb_map_size_bytes") == s["lmdb"]["map_size"] == s["map_size"]
    assert m.value("samplecache_lmdb_map_used_bytes") == s["lmdb"]["used_bytes"] > 0
    assert 1 <= m.value("samplecache_lmdb_readers") <= m.value("samplecache_lmdb_max_readers") == 4096
    assert m.value("samplecache_epochs_sealed_total") == s["epochs_sealed"] == 0
    assert m.total("samplecache_quarantined_files") == len(s["quarantined"]) == 0
    assert m.value("samplecache_health_problems") == len(s["health"]["problems"]) == 0
    assert m.value("samplecache_build_info", version=s["version"]) == 1

    # a lower budget evicts at once: counted under reason="config"
    assert call(d, "PATCH", "/v1/config", {"max_bytes": BUDGET // 2}) == 200
    s, m = settled(d, until)
    assert m.value("samplecache_evictions_total", reason="config") > 0
    assert m.value("samplecache_evicted_bytes_total", reason="config") > 0
    assert m.value("samplecache_cache_bytes") == s["bytes"] <= BUDGET // 2
    assert m.value("samplecache_budget_bytes") == BUDGET // 2
    assert m.total("samplecache_evictions_total") == s["evictions"]


def test_requests_are_timed_under_their_route_template(daemon: Any, until: Any) -> None:
    d = daemon(samplers=1, extra=CHURN)
    until(lambda: status(d)["samples"] > 0, 60, "a first shard")
    assert call(d, "GET", "/v1/epochs/0?min_samples=1") == 200
    assert call(d, "GET", "/v1/epochs/7") == 409  # not the next epoch
    assert call(d, "POST", "/v1/epochs/0/leases", {}, token=False) == 401  # refused by the gate, before routing
    assert call(d, "POST", "/v1/epochs/0/leases", {"ttl": 60}) == 201
    assert call(d, "GET", "/no/such/path/12345") == 404
    m = scrape(d)
    h = "samplecache_http_request_duration_seconds_count"
    assert m.value(h, route="/v1/epochs/{epoch}", method="GET", status="2xx") == 1
    assert m.value(h, route="/v1/epochs/{epoch}", method="GET", status="4xx") == 1
    assert m.value(h, route="/v1/epochs/{epoch}/leases", method="POST", status="4xx") == 1
    assert m.value(h, route="/v1/epochs/{epoch}/leases", method="POST", status="2xx") == 1
    assert m.value(h, route="unmatched", method="GET", status="4xx") == 1
    assert m.value(h, route="/v1/status", method="GET", status="2xx") >= 1
    bucket = "samplecache_http_request_duration_seconds_bucket"
    assert m.value(bucket, route="/v1/epochs/{epoch}", method="GET", status="2xx", le="+Inf") == 1
    with urllib.request.urlopen(d.url + "/openapi.json", timeout=30) as r:
        templates = set(json.loads(r.read())["paths"])
    assert m.routes() <= templates | {"unmatched"}, m.routes() - templates  # never a raw path
    assert "/metrics" in templates
    assert "/metrics" in scrape(d).routes()  # the scrape before this one was timed too
    # what the requests did shows too
    assert m.value("samplecache_epochs_sealed_total") == 1 and m.value("samplecache_epochs_kept") == 1
    assert m.value("samplecache_leases") == 1 == len(status(d)["leases"])
    assert m.value("samplecache_pinned_epochs") == 1


@pytest.fixture(scope="module")
def live(s3: S3Server, typed_dataset: TypedDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    """One scrape of a daemon that has ingested, evicted, sealed an epoch and served a few routes."""
    daemons = Daemons(s3, typed_dataset, tmp_path_factory.mktemp("metrics-live"))
    try:
        d = daemons(samplers=1, extra=CHURN)
        deadline = time.monotonic() + 60
        while status(d)["evictions"] < 2:
            assert time.monotonic() < deadline, "no eviction within 60 s"
            time.sleep(0.1)
        assert call(d, "GET", "/v1/epochs/0") == 200
        yield scrape(d)
    finally:
        daemons.teardown()


def test_every_family_follows_the_naming_conventions(live: Scrape) -> None:
    assert len(live.families) >= len(TYPES)
    problems = []
    for name, f in live.families.items():
        if not f.documentation.strip():
            problems.append(f"{name}: no HELP")
        if not re.fullmatch(r"(samplecache|process|python)_[a-z][a-z0-9_]*", name):
            problems.append(f"{name}: not a samplecache_ (or the standard process_) name in snake case")
        if f.type == "counter" and any(not s.name.endswith("_total") for s in f.samples):
            problems.append(f"{name}: a counter whose samples do not end in _total")
        if f.type != "counter" and name.endswith("_total"):
            problems.append(f"{name}: a {f.type} named like a counter")
        if f.type == "histogram" and not name.endswith("_seconds"):
            problems.append(f"{name}: a histogram without its unit")
        for unit in UNITS:
            if f"_{unit}_" in f"{name}_" and not name.endswith(f"_{unit}"):
                problems.append(f"{name}: names the unit {unit} but does not end with it")
        for s in f.samples:
            if any(not re.fullmatch(r"[a-z_]+", label) for label in s.labels):
                problems.append(f"{name}: label names {sorted(s.labels)}")
    assert not problems, "\n".join(problems)


def test_every_family_is_in_docs_metrics_md(live: Scrape) -> None:
    doc = (REPO / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(samplecache_[a-z0-9_]+)` \|", doc, re.M))
    scraped = {name + ("_total" if f.type == "counter" else "") for name, f in live.families.items()
               if name.startswith("samplecache_")}
    assert not scraped - documented, f"metrics missing from docs/metrics.md: {sorted(scraped - documented)}"


def test_the_grafana_dashboard_names_only_scraped_metrics(live: Scrape) -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dash)
    assert len(exprs) >= 15
    used = {n for e in exprs for n in re.findall(r"\b(?:samplecache|process)_[a-zA-Z0-9_]+\b", e)}
    scraped = {s.name for s in live.samples()} | set(live.families)
    assert not used - scraped, f"the dashboard names metrics /metrics does not have: {sorted(used - scraped)}"
    # the list, each on some panel
    for name in ("samplecache_cache_bytes", "samplecache_budget_bytes", "samplecache_ingested_bytes_total",
                 "samplecache_ingest_seconds_bucket", "samplecache_remote_read_bytes_total",
                 "samplecache_evictions_total", "samplecache_sampler_errors_total", "samplecache_quarantined_files",
                 "samplecache_leases", "samplecache_jobs", "samplecache_coverage_row_ratio",
                 "samplecache_http_request_duration_seconds_bucket", "samplecache_lmdb_map_used_bytes"):
        assert name in used, f"no panel shows {name}"
    # importable: a Prometheus data source input and variable, an instance variable every query filters on
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "samplecache_build_info" in variables["instance"]["definition"]
    assert all('instance=~"$instance"' in e for e in exprs), [e for e in exprs if "$instance" not in e]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert len({p["title"] for p in panels}) == len(panels)
