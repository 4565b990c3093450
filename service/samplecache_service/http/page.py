"""The status page at ``GET /``: what ``/v1/status`` says, for a person, as one server-rendered HTML page.

No script and no request to anything but the daemon: inline SVG charts (``charts.py``) of the recent past
(``history.py``), a meta refresh every few seconds, and one inline stylesheet allowed by its hash in a strict
Content-Security-Policy. Every string that comes from outside (remote paths, quarantine reasons, job names,
lease holders, errors) is HTML-escaped and credential-masked. Every number a test checks carries
``data-metric="NAME"`` and its exact value in ``data-value`` (the text shows it rounded for a person).
"""

from __future__ import annotations

import base64
import hashlib
import time
from html import escape
from typing import Any, Callable, Sequence

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from samplecache_service.config.redact import redact
from samplecache_service.http.deps import DaemonDep
from samplecache_service.http.models import SourceStatus, Status
from samplecache_service.http.routes.jobs import job_out
from samplecache_service.http.status import status_of
from samplecache_service.ops.charts import Series, colour, line_chart, stacked_bars
from samplecache_service.ops.history import Point, rate

REFRESH_S = 5
MAX_POINTS = 480   # a chart plots at most this many points of the history (every k-th, and the last)
ROWS_SHOWN = 50    # rows of a table at most (the JSON API has the rest)

CSS = """
:root{--fg:#1f2328;--muted:#656d76;--line:#d0d7de;--bg:#f6f8fa;--card:#fff;--c1:#0969da;--c2:#1a7f37;--c3:#bc4c00;
--bad:#cf222e;--kept:#8c959f;--c4:#8250df;--c5:#bf3989;--c6:#1b7c83}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"DejaVu Sans",sans-serif;color:var(--fg);
background:var(--bg)}header,main,footer{max-width:1280px;margin:0 auto;padding:12px 20px}
header h1{margin:0;font-size:22px}header p{margin:4px 0;color:var(--muted)}code{font-size:13px}
.state{font-weight:600;padding:1px 8px;border-radius:10px;background:#ddf4ff;color:var(--c1)}
.state.paused,.state.remote,.state.crash{background:#fff8c5;color:#7d4e00}
.problems{background:#ffebe9;border:1px solid #ff818266;border-radius:6px;padding:8px 14px;margin:8px 0}
.problems li{color:var(--bad)}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:10px;margin:10px 0}
.tile{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:10px 12px}
.tile h2{margin:0;font-size:12px;text-transform:uppercase;letter-spacing:.05em;color:var(--muted)}
.tile .big{font-size:22px;font-weight:600;margin:2px 0}.tile p{margin:0;color:var(--muted)}
.meter{width:100%;height:8px;margin-top:6px}.meter .track{fill:var(--line)}.meter .fill{fill:var(--c1)}
.meter .fill.full{fill:var(--bad)}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:10px;margin:10px 0}
.chart{margin:0;background:var(--card);border:1px solid var(--line);border-radius:6px;padding:8px 10px}
figcaption{font-weight:600;margin-bottom:4px}.chart svg{width:100%;height:auto;display:block}
.grid{stroke:var(--line);stroke-width:1}.tick,.empty{fill:var(--muted);font-size:11px}
.line{fill:none;stroke-width:2}.line.c1{stroke:var(--c1)}.line.c2{stroke:var(--c2)}.line.c3{stroke:var(--c3)}
.line.c4{stroke:var(--c4)}.line.c5{stroke:var(--c5)}.line.c6{stroke:var(--c6)}
.line.budget{stroke:var(--bad);stroke-dasharray:6 4}.dot.c1{fill:var(--c1)}.dot.c2{fill:var(--c2)}
.dot.c3{fill:var(--c3)}.dot.c4{fill:var(--c4)}.dot.c5{fill:var(--c5)}.dot.c6{fill:var(--c6)}
.dot.budget{fill:var(--bad)}.bar.kept{fill:var(--kept)}.bar.new{fill:var(--c2)}
.legend{list-style:none;margin:4px 0 0;padding:0;display:flex;gap:14px;color:var(--muted);font-size:12px}
.key{display:inline-block;width:12px;height:4px;margin-right:5px;vertical-align:middle;background:var(--c1)}
.key.c2,.key.new{background:var(--c2)}.key.c3{background:var(--c3)}.key.budget{background:var(--bad)}
.key.kept{background:var(--kept)}.key.c4{background:var(--c4)}.key.c5{background:var(--c5)}
.key.c6{background:var(--c6)}.bad{color:var(--bad)}.muted{color:var(--muted)}
section>h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line);border-radius:6px}
th,td{text-align:left;padding:5px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-size:12px;color:var(--muted);font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.num{white-space:nowrap}
td.path{word-break:break-all;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px}
.none{color:var(--muted);margin:4px 0}footer{color:var(--muted);font-size:12px}footer a{color:var(--c1)}
""".strip()
CSP = ("default-src 'none'; style-src 'sha256-" + base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode()
       + "'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-store"}

router = APIRouter()


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def status_page(d: DaemonDep) -> HTMLResponse:
    """The status page (``docs/status-page.md`` says what each panel shows)."""
    st = status_of(d)
    jobs = [job_out(d.leasing, d.epochs, j) for j in d.jobs.all()]
    points = d.history.points()
    now = d.recorder.now()
    if not points or now.t > points[-1].t:
        points.append(now)
    return HTMLResponse(render(st, jobs, points, now.t), headers=HEADERS)


# -- formatting ------------------------------------------------------------------------------------
def fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n} B"  # not reached


def fmt_count(n: float) -> str:
    return f"{n:,.0f}" if abs(n) >= 100 or n == int(n) else f"{n:.2g}"


def fmt_pct(fraction: float) -> str:
    return f"{100 * fraction:.1f} %"


def fmt_time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def metric(name: str, value: Any, text: str | None = None) -> str:
    """A number a test can read: ``<span data-metric=NAME data-value=exact>shown</span>``."""
    shown = str(value) if text is None else text
    return f'<span data-metric="{escape(name)}" data-value="{escape(str(value))}">{escape(shown)}</span>'


def tile(title: str, big: str, *lines: str) -> str:
    rest = "".join(f"<p>{line}</p>" for line in lines)
    return f'<div class="tile"><h2>{escape(title)}</h2><p class="big">{big}</p>{rest}</div>'


def meter(used: int, budget: int) -> str:
    frac = min(1.0, used / budget) if budget > 0 else 0.0
    full = " full" if frac >= 0.98 else ""
    return ('<svg class="meter" viewBox="0 0 100 8" preserveAspectRatio="none" role="img" '
            f'aria-label="{frac * 100:.0f}% of the budget"><rect class="track" width="100" height="8" rx="3"/>'
            f'<rect class="fill{full}" width="{frac * 100:.2f}" height="8" rx="3"/></svg>')


def table(name: str, heads: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]], empty: str) -> str:
    """``rows``: (the row's data attributes, its cells as HTML); a head ending in '#' is a number column."""
    if not rows:
        return f'<p class="none" data-table="{escape(name)}" data-rows="0">{escape(empty)}</p>'
    th = "".join(f'<th class="num">{escape(h[:-1])}</th>' if h.endswith("#") else f"<th>{escape(h)}</th>"
                 for h in heads)
    body = []
    for attrs, cells in rows[:ROWS_SHOWN]:
        tds = "".join(f'<td class="num">{c}</td>' if h.endswith("#") else
                      f'<td class="path">{c}</td>' if h in ("file", "holder", "url") else f"<td>{c}</td>"
                      for h, c in zip(heads, cells))
        body.append(f"<tr {attrs}>{tds}</tr>")
    more = f'<p class="none">and {len(rows) - ROWS_SHOWN} more</p>' if len(rows) > ROWS_SHOWN else ""
    return (f'<table data-table="{escape(name)}" data-rows="{len(rows)}"><thead><tr>{th}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>{more}')


# -- the page ------------------------------------------------------------------------------------------
def render(st: Status, jobs: Sequence[dict[str, Any]], points: Sequence[Point], now: float) -> str:
    parts = [_header(st), "<main>", _problems(st), _tiles(st), _sources(st), _charts(st, points, now), _jobs(jobs),
             _leases(st, now), _quarantine(st), "</main>", _footer(now)]
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<meta http-equiv="refresh" content="{REFRESH_S}"><title>samplecache status</title>'
            f"<style>{CSS}</style></head><body>" + "".join(parts) + "</body></html>")


def _header(st: Status) -> str:
    state = st.sampler.state
    reason = f" ({escape(redact(st.sampler.reason))})" if st.sampler.reason else ""
    several = len(st.sources) > 1
    source = (f"{len(st.sources)} sources " + ", ".join(f"<code>{escape(s.name)}</code>" for s in st.sources)
              if several else f"source <code>{escape(st.source)}</code>")
    return ("<header><h1>samplecache</h1>"
            f'<p>{source} &middot; version {escape(st.version)} &middot; '
            f'up {metric("uptime_s", round(st.uptime_s, 1), _duration(st.uptime_s))} &middot; samplers '
            f'<span class="state {escape(state.split()[0])}" data-metric="sampler_state" data-value="{escape(state)}">'
            f"{escape(state)}</span>{reason}</p></header>")


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _problems(st: Status) -> str:
    items = [redact(str(p)) for p in st.health.get("problems", [])]
    if st.last_error:
        items.append(f"last error: {st.last_error}")
    if not items:
        return ""
    lis = "".join(f"<li>{escape(i)}</li>" for i in items)
    return f'<div class="problems" data-section="problems"><ul>{lis}</ul></div>'


def _tiles(st: Status) -> str:
    cov = st.coverage or {}
    frac = float(cov.get("row_fraction", 0.0))
    tiles = [
        tile("Cache", metric("cache_bytes", st.bytes, fmt_bytes(st.bytes)),
             f'of {metric("max_bytes", st.max_bytes, fmt_bytes(st.max_bytes))} budget' + meter(st.bytes, st.max_bytes)),
        tile("Samples", metric("samples", st.samples, fmt_count(st.samples)),
             f'in {metric("shards", st.shards, fmt_count(st.shards))} shards'),
        tile("Ingest", metric("ingest_bytes_per_s", st.ingest.bytes_per_s, fmt_bytes(st.ingest.bytes_per_s) + "/s"),
             f'{metric("ingest_samples_per_s", st.ingest.samples_per_s, fmt_count(st.ingest.samples_per_s))} '
             f'samples/s (last minute)',
             f'{metric("commits", st.ingest.commits, fmt_count(st.ingest.commits))} shards ingested'),
        tile("Evictions", metric("evictions", st.evictions, fmt_count(st.evictions)),
             f"shards evicted since start ({escape(st.eviction_policy)})"),
        tile("Coverage", metric("coverage_row_fraction", frac, fmt_pct(frac)) if st.coverage else
             metric("coverage_row_fraction", "", "not known yet"),
             f'{metric("coverage_units_sampled", cov.get("units_sampled", 0))} of '
             f'{metric("coverage_units", cov.get("units", 0))} units, pass '
             f'{metric("coverage_cycle", cov.get("cycle", 0), str(int(cov.get("cycle", 0)) + 1))}',
             # never sampled this pass: units of quarantined files (an unreadable one counts one) and given up
             f'{metric("coverage_units_left_out", cov.get("units_left_out", 0))} left out'),
        tile("Epochs", metric("epochs_sealed", st.epochs_sealed, fmt_count(st.epochs_sealed)),
             f'sealed; last {metric("last_epoch", st.last_epoch)}; '
             f'{metric("jobs", st.jobs)} jobs, {metric("leases", st.leases_live)} leases'),
        tile("Remote", metric("remote_bytes_read", st.remote.bytes_read, fmt_bytes(st.remote.bytes_read)),
             f'read; {metric("remote_errors", st.remote_errors)} errors, '
             f'{metric("quarantined", len(st.quarantined))} files quarantined'),
        tile("Disk free", metric("disk_free", st.disk_free, fmt_bytes(st.disk_free)),
             f'LMDB file {fmt_bytes(st.lmdb.get("file_bytes", 0))}'),
    ]
    return f'<section class="tiles" data-section="tiles">{"".join(tiles)}</section>'


def _sources(st: Status) -> str:
    """A row per named source: what it holds of its share, and how its sampling goes."""
    rows = [(f'data-source="{escape(s.name)}"',
             [escape(s.name), escape(redact(s.url)), metric("source_share", s.share, fmt_pct(s.share)),
              f'{metric("source_bytes", s.bytes, fmt_bytes(s.bytes))} of '
              f'{metric("source_max_bytes", s.max_bytes, fmt_bytes(s.max_bytes))}' + meter(s.bytes, s.max_bytes),
              metric("source_samples", s.samples, fmt_count(s.samples)),
              metric("source_shards", s.shards, fmt_count(s.shards)),
              f'<span class="state {escape(s.state.split()[0])}" data-metric="source_state" '
              f'data-value="{escape(s.state)}">{escape(s.state)}</span>', _why(s)])
            for s in st.sources]
    return ('<section data-section="sources"><h2>Sources</h2>'
            + table("sources", ["source", "url", "share#", "bytes of share#", "samples#", "shards#", "state",
                                "problem"], rows, "No source is set.") + "</section>")


def _why(s: SourceStatus) -> str:
    """What is wrong with a source (red), else why it waits, else ``-``."""
    if s.problem:
        return f'<span class="bad" data-problem>{escape(redact(s.problem))}</span>'
    return f'<span class="muted">{escape(redact(s.reason))}</span>' if s.reason else "-"


def _every(points: Sequence[Point]) -> list[Point]:
    """At most MAX_POINTS of ``points``, evenly spaced, always with the last."""
    k = max(1, -(-len(points) // MAX_POINTS))
    kept = list(points[::k])
    if points and kept[-1] is not points[-1]:
        kept.append(points[-1])
    return kept


def _rates(points: Sequence[Point], counter: Callable[[Point], int], scale: float = 1.0) -> list[tuple[float, float]]:
    return [(b.t, rate(a, b, counter) * scale) for a, b in zip(points, points[1:])]


def _charts(st: Status, history: Sequence[Point], now: float) -> str:
    pts = _every(history)
    span = max(60.0, now - pts[0].t) if pts else 60.0

    # line_chart's x axis is seconds relative to now (negative: the past)
    def rel(tv: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
        return [(t - now, v) for t, v in tv]

    cache = line_chart("cache_bytes", "Cache bytes vs budget", [
        Series("resident sample bytes", rel([(p.t, p.bytes) for p in pts]), "c1"),
        Series("budget", rel([(p.t, p.max_bytes) for p in pts]), "budget")], span, fmt_bytes,
        floor_top=float(st.max_bytes))
    ingest = line_chart("ingest_rate", "Ingest rate", [
        Series("sample bytes ingested /s", rel(_rates(pts, lambda p: p.ingested_bytes)), "c1"),
        Series("remote bytes read /s", rel(_rates(pts, lambda p: p.remote_bytes)), "c2")],
        span, lambda v: fmt_bytes(v) + "/s")
    evictions = line_chart("evictions", "Evictions", [
        Series("shards evicted per minute", rel(_rates(pts, lambda p: p.evictions, 60.0)), "c3")],
        span, fmt_count, floor_top=1.0)
    coverage = line_chart("coverage", "Coverage of the remote (this pass)", [
        Series("rows sampled", rel([(p.t, 100 * p.coverage) for p in pts if p.coverage is not None]), "c2")],
        span, lambda v: f"{v:.0f} %", floor_top=100.0)
    # with several sources, what each holds (one source: the cache chart is its chart)
    by_source = line_chart("source_bytes", "Resident bytes by source", [
        Series(s.name, rel([(p.t, p.source_bytes(s.name)) for p in pts]), colour(i))
        for i, s in enumerate(st.sources)], span, fmt_bytes,
        floor_top=float(max((s.max_bytes for s in st.sources), default=0))) if len(st.sources) > 1 else ""
    epochs = st.epochs
    bars = stacked_bars("epochs", "Samples per epoch: kept from the previous epoch, new",
                        [str(e.epoch) for e in epochs],
                        [(max(0, e.samples - e.new_samples), e.new_samples) for e in epochs],
                        [("kept", "kept"), ("new", "new")], fmt_count)
    rows = [(f'data-epoch="{e.epoch}"',
             [str(e.epoch), metric("epoch_samples", e.samples, fmt_count(e.samples)),
              metric("epoch_new_samples", e.new_samples, fmt_count(e.new_samples)),
              fmt_count(e.samples - e.new_samples), fmt_count(e.shards), fmt_bytes(e.bytes), fmt_time(e.sealed_at)])
            for e in reversed(epochs)]
    table_html = table("epochs", ["epoch", "samples#", "new#", "kept#", "shards#", "bytes#", "sealed at"], rows,
                       "No epoch sealed yet: the first GET /v1/epochs/N (or a job's epoch) seals one.")
    return (f'<section class="charts" data-section="charts">{cache}{by_source}{ingest}{evictions}{coverage}{bars}'
            f'</section><section><h2>Epochs (latest first)</h2>{table_html}</section>')


def _jobs(jobs: Sequence[dict[str, Any]]) -> str:
    rows = [(f'data-job="{escape(j["name"])}"',
             [escape(j["name"]), escape(j["state"]), str(int(j["next_epoch"])), fmt_count(j["samples_read"]),
              str(len(j["leases"])), fmt_time(j.get("last_heartbeat")), str(int(j["runs"]))]) for j in jobs]
    return ('<section><h2>Jobs</h2>' + table("jobs", ["job", "state", "next epoch#", "samples read#",
                                                            "leases#", "last heartbeat", "runs#"], rows,
                                                    "No job has attached yet.") + "</section>")


def _leases(st: Status, now: float) -> str:
    rows = []
    for lease in st.leases:
        job = lease.get("job")
        where = f'{escape(str(job))} epoch {lease.get("job_epoch")}' if job else "-"
        rows.append((f'data-lease-epoch="{int(lease["epoch"])}"',
                     [str(int(lease["epoch"])), where, escape(redact(str(lease.get("holder") or "-"))),
                      fmt_count(int(lease.get("read") or 0)), f'{max(0.0, float(lease["expires_at"]) - now):.0f} s']))
    return ('<section><h2>Leases</h2>' + table("leases", ["daemon epoch#", "job", "holder", "read#",
                                                                "expires in#"], rows,
                                                      "No live lease: nothing is pinned by a reader.")
            + "</section>")


def _quarantine(st: Status) -> str:
    rows = [("data-quarantined", [escape(q.path), escape(q.reason), fmt_time(q.at)]) for q in st.quarantined]
    return ('<section><h2>Quarantined files</h2>' + table("quarantine", ["file", "reason", "since"], rows,
                                                                "No file is quarantined.") + "</section>")


def _footer(now: float) -> str:
    return (f'<footer>Rendered {metric("rendered_at", round(now, 3), fmt_time(now))}; refreshes every {REFRESH_S} s. '
            'JSON: <a href="/v1/status">/v1/status</a>, <a href="/v1/jobs">/v1/jobs</a>, '
            '<a href="/v1/quarantine">/v1/quarantine</a>; <a href="/metrics">/metrics</a>; '
            'API: <a href="/docs">/docs</a>.</footer>')
