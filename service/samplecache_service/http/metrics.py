"""Prometheus metrics: ``GET /metrics`` in the text format (0.0.4), built with ``prometheus-client``.

Each app has its own registry (never the process-wide default one: tests build several apps in one process):

* ``DaemonCollector`` reads the numbers ``/v1/status`` shows at scrape time (catalog, scheduler, supervisor,
  writer, traffic, leases, jobs, LMDB), so no second copy of them is kept and a scrape cannot disagree with them;
* two real histograms, where a distribution is the point: ingest latency (``Writer.observe_ingest``: from the
  staged shard handed to the writer to its commit) and HTTP request latency by route *template*
  (``HttpTimer``, a pure ASGI middleware; an unmatched path counts as ``route="unmatched"``);
* the standard ``process_*`` collector (CPU, memory, open files of the daemon process).

The daemon-wide families keep their meaning; each named source has its own series in the ``samplecache_source_*``
families, labelled ``source`` (``source_families``, from what ``GET /v1/sources`` shows).

Names follow https://prometheus.io/docs/practices/naming/: the ``samplecache_`` prefix, base units in the name
(``_bytes``, ``_seconds``, ``_ratio``), counters end in ``_total``. docs/metrics.md describes every one;
deploy/grafana/samplecache-dashboard.json is built on them.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, cast

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from starlette.routing import compile_path

from samplecache.version import __version__
from samplecache_service.http.deps import DaemonDep
from samplecache_service.http.gate import ASGIApp, Message, Receive, Scope, Send
from samplecache_service.http.models import SourceStatus
from samplecache_service.http.status import lmdb_usage, sources_of
from samplecache_service.remote.stores import ErrorKind

if TYPE_CHECKING:
    from samplecache_service.daemon import Daemon

PREFIX = "samplecache_"
ERROR_CLASSES = tuple(k.value for k in ErrorKind)  # every class has its series from the start
EVICTION_REASONS = ("ingest", "config", "removed")  # writer.Writer.evicted
QUARANTINE_KINDS = (ErrorKind.CORRUPT.value, ErrorKind.SCHEMA.value)
SAMPLER_STATES = ("discovering", "sampling", "paused", "remote error", "crash loop")  # Scheduler.state
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # any other: "other"
UNMATCHED = "unmatched"  # the route label of a path no route matches (raw paths would be unbounded)
INGEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def _by(family: GaugeMetricFamily | CounterMetricFamily, values: Mapping[str, float]) -> Metric:
    for label, value in values.items():
        family.add_metric([label], value)
    return family


def _cov(key: str) -> Callable[[SourceStatus], float | None]:
    return lambda s: float(s.coverage[key]) if s.coverage else None  # no series before the source is discovered


# the per-source families, each labelled ``source``: (type, name, help, value; None: no series for that source)
SOURCE_FAMILIES: tuple[tuple[str, str, str, Callable[[SourceStatus], float | None]], ...] = (
    ("gauge", "source_up", "1 while the source has no problem (a failing remote, every file quarantined), else 0",
     lambda s: float(s.problem is None)),
    ("gauge", "source_ready", "1 when a new epoch names the source's shards", lambda s: float(s.ready)),
    ("gauge", "source_bytes", "Resident sample bytes of the source", lambda s: s.bytes),
    ("gauge", "source_budget_bytes", "The source's share of the budget, in bytes", lambda s: s.max_bytes),
    ("gauge", "source_share_ratio", "The source's fraction of the budget", lambda s: s.share),
    ("gauge", "source_samples", "Resident samples of the source", lambda s: s.samples),
    ("gauge", "source_shards", "Resident shards of the source", lambda s: s.shards),
    ("counter", "source_remote_errors", "Remote errors of the source: failed sampling tasks and failed discoveries",
     lambda s: s.remote_errors),
    ("counter", "source_discovery_read_bytes", "Bytes the daemon's discovery read from the source (footers; the "
     "samplers' reads are not split by source)", lambda s: s.remote_bytes),
    ("gauge", "source_quarantined_files", "Files of the source quarantined now", lambda s: s.quarantined),
    ("gauge", "source_coverage_row_ratio", "Fraction of the source's rows on this node sampled this pass",
     _cov("row_fraction")),
    ("gauge", "source_coverage_unit_ratio", "Fraction of the source's units on this node sampled this pass",
     _cov("unit_fraction")),
    ("gauge", "source_coverage_passes", "Completed passes over the source", _cov("cycle")),
)


def source_families(sources: Sequence[SourceStatus]) -> Iterator[Metric]:
    """The ``samplecache_source_*`` families of ``sources`` (prometheus-client escapes the label values)."""
    for kind, name, doc, value in SOURCE_FAMILIES:
        family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(PREFIX + name, doc,
                                                                                  labels=["source"])
        for s in sources:
            v = value(s)
            if v is not None:
                family.add_metric([s.name], v)
        if family.samples:
            yield family
    state = GaugeMetricFamily(PREFIX + "source_state", "1 for each source's sampling state now",
                              labels=["source", "state"])
    for s in sources:
        for k in SAMPLER_STATES:
            state.add_metric([s.name, k], float(k == s.state))
    if state.samples:
        yield state


def _every(keys: Sequence[str], counts: Mapping[str, float]) -> dict[str, float]:
    """``counts`` with every one of ``keys`` present (0 when not seen yet): a series exists before its first event."""
    return {**{k: 0.0 for k in keys}, **counts}


class DaemonCollector:
    """Reads the daemon's state when scraped; yields nothing before the daemon is attached."""

    def __init__(self) -> None:
        self.daemon: "Daemon | None" = None
        self._quarantine: tuple[int, dict[str, float]] = (-1, {})  # (catalog.files_version, by kind)

    def collect(self) -> Iterator[Metric]:
        d = self.daemon
        if d is None:
            return
        yield from self._cache(d)
        yield from self._ingest(d)
        yield from self._sampling(d)
        yield from self._readers(d)
        yield from self._lmdb(d)
        yield from source_families(sources_of(d))

    def _cache(self, d: "Daemon") -> Iterator[Metric]:
        catalog = d.catalog
        yield InfoMetricFamily(PREFIX + "build", "The daemon's version", value={"version": __version__})
        yield _gauge("start_time_seconds", "When the daemon started (Unix time)", d.started)
        yield _gauge("cache_bytes", "Resident sample bytes", catalog.resident_bytes)
        yield _gauge("budget_bytes", "The budget: most sample bytes kept on disk (max_bytes)", d.max_bytes)
        yield _gauge("manifest_bytes", "Bytes of the kept epoch manifests (they count within the budget)",
                     catalog.manifest_total)
        yield _gauge("shards", "Resident shards", catalog.shard_count())
        yield _gauge("samples", "Resident samples", catalog.resident_rows)
        yield _gauge("disk_free_bytes", "Disk bytes free for shards (the filesystem and LMDB's free pages)",
                     d.disk.free_or_zero())
        yield _gauge("min_free_disk_bytes", "The free-disk guard: sampling pauses below it", d.min_free_disk)
        yield _by(CounterMetricFamily(PREFIX + "evictions", "Shards evicted since start, by reason (ingest: to "
                                      "make room for a new shard; config: the budget or policy changed; removed: "
                                      "their file left its table or the filter)",
                                      labels=["reason"]), _every(EVICTION_REASONS, d.writer.evicted))
        yield _by(CounterMetricFamily(PREFIX + "evicted_bytes", "Bytes of the shards evicted since start, by reason",
                                      labels=["reason"]), _every(EVICTION_REASONS, d.writer.evicted_bytes))

    def _ingest(self, d: "Daemon") -> Iterator[Metric]:
        done = d.writer.ingested
        yield _counter("ingested_shards", "Shards ingested since start", done["shards"])
        yield _counter("ingested_samples", "Samples ingested since start", done["rows"])
        yield _counter("ingested_bytes", "Sample bytes ingested since start", done["bytes"])
        yield _counter("lmdb_commits", "LMDB write transactions committed since start", d.writer.commits)
        yield _counter("remote_read_bytes", "Bytes read from the remote since start (sampled units and footers)",
                       d.traffic.total())
        fetched, needed = d.traffic.sampler_totals()
        yield _counter("remote_sampler_bytes", "Bytes the samplers fetched from the remote (column chunks and "
                       "footers)", fetched)
        yield _counter("remote_needed_bytes", "Bytes of the column chunks the sampled units needed; "
                       "remote_sampler_bytes over it is the read amplification", needed)
        yield _gauge("pacing_allowance_bytes", "Bytes the pacer lets the samplers cache before the next epoch",
                     int(d.traffic.pacer.allowance))

    def _sampling(self, d: "Daemon") -> Iterator[Metric]:
        s = d.scheduler
        state = d.scheduler.state()
        yield _by(GaugeMetricFamily(PREFIX + "sampler_state", "1 for the samplers' current state",
                                    labels=["state"]), {k: float(k == state) for k in SAMPLER_STATES})
        yield _gauge("sampler_processes", "Sampler processes", d.supervisor.size)
        yield _gauge("sampler_tasks", "Sampling tasks queued or running", d.supervisor.pending())
        yield _counter("sampler_restarts", "Sampler processes that died and were replaced", d.supervisor.restarts)
        yield _counter("sampler_start_failures", "Sampler processes that died before they were ready (started again "
                       "with a backoff)", d.supervisor.start_failures)
        yield _by(CounterMetricFamily(PREFIX + "sampler_errors", "Failed sampling tasks, by class", labels=["class"]),
                  _every(ERROR_CLASSES, dict(s.unit_failures)))
        yield _counter("sampler_units_given_up", "Remote units given up for a pass after failing again and again",
                       s.units_given_up)
        yield _counter("remote_errors", "Remote errors: failed sampling tasks and failed discoveries", d.remote_errors)
        yield _by(GaugeMetricFamily(PREFIX + "quarantined_files", "Remote files quarantined, by kind",
                                    labels=["kind"]), self._quarantined(d))
        cov = d.scheduler.coverage()
        if cov is not None:  # never claimed before the remote is known
            yield _gauge("coverage_row_ratio", "Fraction of this node's remote rows sampled at least once this pass",
                         cov["row_fraction"])
            yield _gauge("coverage_unit_ratio", "Fraction of this node's remote units sampled at least once this pass",
                         cov["unit_fraction"])
            yield _gauge("coverage_passes", "Completed passes over the remote (the cycle number)", cov["cycle"])
            yield _gauge("remote_units", "Remote units (row groups) on this node", cov["units"])
            yield _gauge("remote_rows", "Remote rows on this node", cov["rows"])
        problems = d.health.problems()
        yield _gauge("health_problems", "Problems /healthz reports now (0: healthy)", len(problems))
        yield _by(CounterMetricFamily(PREFIX + "thread_failures", "Failures of each background thread",
                                      labels=["thread"]),
                  {name: float(cast(int, t["failures"])) for name, t in d.health.snapshot().items()})

    def _quarantined(self, d: "Daemon") -> dict[str, float]:
        """Quarantined files by kind, counted again only when the files table changed."""
        version = d.catalog.files_version
        if self._quarantine[0] != version:
            kinds = Counter(i.kind for i in d.catalog.files().values() if i.quarantined)
            self._quarantine = (version, _every(QUARANTINE_KINDS, {k: float(n) for k, n in kinds.items()}))
        return dict(self._quarantine[1])

    def _readers(self, d: "Daemon") -> Iterator[Metric]:
        eps = d.catalog.epochs()
        yield _counter("epochs_sealed", "Epochs sealed (epochs are numbered from 0 and sealed in order)",
                       eps[-1] + 1 if eps else 0)
        yield _gauge("epochs_kept", "Sealed epochs whose manifests are kept", len(eps))
        yield _gauge("pinned_epochs", "Epochs pinned by leases, jobs or a fresh seal", len(d.epochs.pinned_epochs()))
        yield _gauge("leases", "Live leases", len(d.leases.live()))
        yield _gauge("jobs", "Jobs that are not expired", d.jobs.active())

    def _lmdb(self, d: "Daemon") -> Iterator[Metric]:
        use = lmdb_usage(d)
        with d.gate.using() as env:
            info = env.info()
        yield _gauge("lmdb_map_used_bytes", "Bytes of the LMDB map in use (pages up to the last one used)",
                     use["used_bytes"])
        yield _gauge("lmdb_map_size_bytes", "The LMDB map size (derived from the budget)", use["map_size"])
        yield _gauge("lmdb_file_bytes", "Size of the LMDB data file on disk", use["file_bytes"])
        yield _gauge("lmdb_readers", "LMDB reader slots in use (daemon and client processes)", info["num_readers"])
        yield _gauge("lmdb_max_readers", "LMDB reader slots in all", info["max_readers"])


class RouteTemplates:
    """The route template of a request: the route the router picked, else (a request the gate refused before
    routing, or a 404) the first of the app's OpenAPI paths that matches; else ``unmatched``. Never the raw path."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._paths: list[tuple[re.Pattern[str], str]] | None = None

    def load(self) -> None:
        """Read the templates (once every route is added: ``Metrics.start``)."""
        self._paths = [(compile_path(t)[0], t) for t in self.app.openapi().get("paths", {})]

    def __call__(self, scope: Scope) -> str:
        route = scope.get("route")
        path = getattr(route, "path_format", None) or getattr(route, "path", None)  # as the OpenAPI writes it
        if isinstance(path, str) and path:
            return path
        if self._paths is None:  # an app served without its lifespan
            self.load()
        return next((t for regex, t in self._paths or () if regex.match(scope["path"])), UNMATCHED)


class Metrics:
    """One app's registry: the daemon collector, the ingest and HTTP histograms, the process collector."""

    def __init__(self, templates: RouteTemplates) -> None:
        self.templates = templates
        # no ``*_created`` gauge beside every histogram series (a process-wide switch: the daemon's process)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self.collector = DaemonCollector()
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)
        self.ingest_seconds = Histogram(
            PREFIX + "ingest_seconds", "Seconds from a staged shard handed to the LMDB writer to its commit",
            buckets=INGEST_BUCKETS, registry=self.registry)
        self.http_seconds = Histogram(
            PREFIX + "http_request_duration_seconds", "HTTP request latency, by route template, method and "
            "status class", ["route", "method", "status"], buckets=HTTP_BUCKETS, registry=self.registry)

    def attach(self, d: "Daemon") -> None:
        """Read ``d`` from now on."""
        self.collector.daemon = d
        d.writer.observe_ingest = self.ingest_seconds.observe

    def start(self, d: "Daemon") -> None:
        """At the app's start (its lifespan): read ``d``, and learn the route templates now that every route
        exists (building the OpenAPI takes tens of ms: never on the event loop while requests wait)."""
        self.attach(d)
        self.templates.load()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HttpTimer:
    """Pure ASGI middleware: times every HTTP request into ``samplecache_http_request_duration_seconds``."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.histogram, self.templates = app, metrics.http_seconds, metrics.templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # an exception before any reply becomes a 500 (ServerErrorMiddleware, outside us)

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.histogram.labels(self.templates(scope), method, f"{status // 100}xx").observe(
                time.perf_counter() - start)


METRICS_REPLY: dict[int | str, dict[str, Any]] = {
    200: {"description": "Prometheus text format 0.0.4 (docs/metrics.md lists every metric)",
          "content": {"text/plain": {"schema": {"type": "string"}}}}}


def add_metrics(app: FastAPI, daemon: "Daemon | None" = None) -> Metrics:
    """``GET /metrics`` (read-only: no token, as ``/v1/status``) and the HTTP timer, outside every other
    middleware so the gate's refusals are timed too. Call it after the other middleware is added, and
    ``start`` in the app's lifespan. ``daemon``: one built already (attached now, so that its first ingests are
    timed before the app starts)."""
    metrics = Metrics(RouteTemplates(app))
    if daemon is not None:
        metrics.attach(daemon)
    app.add_middleware(HttpTimer, metrics=metrics)

    @app.get("/metrics", response_class=PlainTextResponse, responses=METRICS_REPLY, tags=["cache"])
    async def scrape(d: DaemonDep) -> Response:
        """Prometheus metrics of the cache, the samplers, ingest, readers, LMDB and the HTTP API."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    return metrics
