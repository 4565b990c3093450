"""The status page at GET /, in a real headless Chromium against a live daemon that is ingesting from the S3
server of conftest.py (tests/support/chromium.py drives Debian's ``chromium`` over the DevTools protocol).

The page's numbers are read from the rendered DOM (``data-metric`` / ``data-value``) and compared with
``/v1/status`` fetched just before and just after: counters must lie between the two while sampling runs, and
equal them exactly once sampling is paused. Strings from outside (a remote file name and a lease holder with
``<script>`` in them) must show as text. A screenshot is saved in the test's directory.
"""

from __future__ import annotations

import json
import struct
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
from chromium import Chromium, Page
from parquet_data import write_dataset

pytestmark = pytest.mark.e2e

PREFIX = "statuspage"
EVIL_FILE = "bad<script>document.title='pwned'</script>.parquet"  # a corrupt file: quarantined
EVIL_HOLDER = "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script> rank 0"
BUDGET = 150_000        # ~10 shards of ~15 KB: the cache fills, then evicts while sampling goes on
CAP = 100               # samples of a job's epoch at most (2 shards): the pinned epochs leave room to churn
RATE = "60kB"           # remote bytes per second at most: a steady ingest a 2-core machine keeps up with
RUN = "0123456789abcdef"
COUNTERS = ("commits", "evictions", "remote_bytes_read", "epochs_sealed", "last_epoch", "coverage_cycle")
EXACT = ("cache_bytes", "max_bytes", "samples", "shards", "commits", "evictions", "remote_bytes_read",
         "epochs_sealed", "last_epoch", "jobs", "leases", "quarantined", "remote_errors", "coverage_units",
         "coverage_units_sampled", "coverage_units_left_out", "coverage_cycle", "coverage_row_fraction",
         "sampler_state")
READ_METRICS = ("Object.fromEntries([...document.querySelectorAll('[data-metric]')]"
                ".map(e => [e.dataset.metric, e.dataset.value]))")


@pytest.fixture(scope="module")
def page_dataset(s3: Any, bucket: str) -> str:
    fs = s3.fs()
    prefix = f"{bucket}/{PREFIX}"
    write_dataset(fs, prefix, 3, 600, 50, seed=21)  # 36 row groups of 50 rows
    fs.pipe(f"{prefix}/{EVIL_FILE}", b"\x00not parquet\xff" * 300)
    return f"s3://{prefix}"


def call(d: Any, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(d.url + path, method=method, headers={**d.headers, "Content-Type": "application/json"},
                                 data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def status(d: Any) -> dict[str, Any]:
    with urllib.request.urlopen(d.url + "/v1/status", timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def expected(s: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of a status, by data-metric name, in the page's data-value text."""
    cov = s["coverage"] or {}
    return {"cache_bytes": s["bytes"], "max_bytes": s["max_bytes"], "samples": s["samples"], "shards": s["shards"],
            "commits": s["ingest"]["commits"], "evictions": s["evictions"],
            "remote_bytes_read": s["remote"]["bytes_read"], "epochs_sealed": s["epochs_sealed"],
            "last_epoch": s["last_epoch"], "jobs": s["jobs"], "leases": len(s["leases"]),
            "quarantined": len(s["quarantined"]), "remote_errors": s["remote_errors"],
            "coverage_units": cov.get("units", 0), "coverage_units_sampled": cov.get("units_sampled", 0),
            "coverage_units_left_out": cov.get("units_left_out", 0),
            "coverage_cycle": cov.get("cycle", 0), "coverage_row_fraction": cov.get("row_fraction", 0.0),
            "sampler_state": s["sampler"]["state"], "disk_free": s["disk_free"],
            "ingest_bytes_per_s": s["ingest"]["bytes_per_s"], "ingest_samples_per_s": s["ingest"]["samples_per_s"]}


def as_number(v: str) -> float:
    return float(v)


def page_numbers(page: Page) -> dict[str, str]:
    got = page.eval(READ_METRICS)
    assert isinstance(got, dict) and got, "no data-metric on the page"
    return got


def png_size(path: Path) -> tuple[int, int]:
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", raw[16:24])  # type: ignore[return-value]


def test_status_page_in_chromium_matches_the_status_of_a_live_daemon(
        daemon: Any, page_dataset: str, tmp_path: Path, until: Callable[..., Any]) -> None:
    d = daemon(page_dataset, samplers=1, extra=["--pacing", "off", "--max-bytes", str(BUDGET),
                                                "--max-ingest-rate", RATE, "--lease-ttl", "600"])
    # a live, full cache that keeps evicting; the corrupt file quarantined; a job with a leased epoch
    until(lambda: status(d)["evictions"] >= 3 and status(d)["quarantined"], 90, "evictions and a quarantined file")
    [q] = status(d)["quarantined"]
    assert q["path"].endswith(EVIL_FILE), q
    call(d, "POST", "/v1/jobs", {"name": "train-a", "run": RUN})
    e0 = call(d, "POST", f"/v1/jobs/train-a/epochs/0?run={RUN}&max_samples={CAP}")["daemon_epoch"]
    call(d, "POST", f"/v1/epochs/{e0}/leases", {"job": "train-a", "run": RUN, "job_epoch": 0, "holder": EVIL_HOLDER})
    sealed_at = status(d)["ingest"]["commits"]
    until(lambda: status(d)["ingest"]["commits"] >= sealed_at + 5, 60, "new shards after epoch 0")
    call(d, "POST", f"/v1/jobs/train-a/epochs/1?run={RUN}&max_samples={CAP}")

    r = urllib.request.urlopen(d.url + "/", timeout=30)
    csp = r.headers["Content-Security-Policy"]
    assert r.headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in csp and "http" not in csp and "unsafe" not in csp, csp
    assert "script-src" not in csp, "the page runs no script at all"

    with Chromium(tmp_path / "chromium") as browser:
        # ---------------------------------------------------------------- live: counters between before and after
        before = status(d)
        page = browser.open(d.url + "/")
        shown = page_numbers(page)
        after = status(d)
        until(lambda: status(d)["ingest"]["commits"] > before["ingest"]["commits"], 30, "ingest to go on")
        lo, hi = expected(before), expected(after)
        for name in COUNTERS:
            assert lo[name] <= as_number(shown[name]) <= hi[name], (name, lo[name], shown[name], hi[name])
        assert shown["max_bytes"] == str(BUDGET)
        # paced by --max-ingest-rate, the samplers go from sampling to paused and back many times a second: a state
        # the page rendered between two that read paused may be sampling (or the other way round)
        pacing = {lo["sampler_state"], hi["sampler_state"]} <= {"sampling", "paused"}
        assert shown["sampler_state"] in ((lo["sampler_state"], hi["sampler_state"]) if not pacing
                                          else ("sampling", "paused"))
        assert 0 < as_number(shown["cache_bytes"]) <= BUDGET

        # ---------------------------------------------------------------- charts, epochs, jobs, leases
        charts = page.eval("Object.fromEntries([...document.querySelectorAll('figure[data-chart]')]"
                           ".map(f => [f.dataset.chart, +f.dataset.points]))")
        assert set(charts) == {"cache_bytes", "ingest_rate", "evictions", "coverage", "epochs"}, charts
        assert charts["cache_bytes"] >= 2 and charts["ingest_rate"] >= 1, charts
        assert charts["epochs"] == len(after["epochs"]) == 2, (charts, after["epochs"])
        assert page.eval("document.querySelectorAll('figure[data-chart=epochs] rect.bar').length") >= 2
        assert page.eval("document.querySelectorAll('figure[data-chart=cache_bytes] polyline').length") == 2
        epochs = page.eval("[...document.querySelectorAll('tr[data-epoch]')].map(r => [+r.dataset.epoch, "
                           "r.querySelector('[data-metric=epoch_samples]').dataset.value, "
                           "r.querySelector('[data-metric=epoch_new_samples]').dataset.value])")
        assert sorted(epochs) == sorted([e["epoch"], str(e["samples"]), str(e["new_samples"])]
                                        for e in after["epochs"]), (epochs, after["epochs"])
        assert page.eval("!!document.querySelector('tr[data-job=\"train-a\"]')"), "the job is not listed"
        # one source: its one row (and no per-source chart: the cache chart is its chart)
        assert page.eval("[...document.querySelectorAll('tr[data-source]')].map(r => r.dataset.source)") == \
            [s["name"] for s in after["sources"]] == ["default"]
        assert page.eval("document.querySelector('[data-table=leases]').dataset.rows") == str(len(after["leases"]))

        # ---------------------------------------------------------------- outside strings are text, never markup
        paths = page.eval("[...document.querySelectorAll('tr[data-quarantined] td.path')].map(c => c.textContent)")
        assert paths == [q["path"]], paths
        holders = page.eval("[...document.querySelectorAll('[data-table=leases] td.path')].map(c => c.textContent)")
        assert EVIL_HOLDER in holders, holders
        assert page.eval("document.scripts.length") == 0
        assert page.eval("document.querySelectorAll('img').length") == 0
        assert page.eval("document.title") == "samplecache status"
        # the hashed stylesheet was allowed by the CSP (its background colour applies) and nothing was refused
        assert page.eval("getComputedStyle(document.body).backgroundColor") == "rgb(246, 248, 250)"
        assert not [c for c in page.console() if "Content Security Policy" in c or "Refused" in c], page.console()
        assert all(u.startswith(d.url + "/") for u in page.requests()), page.requests()

        shot = page.screenshot(tmp_path / "status-page.png")
        width, height = png_size(shot)
        assert width >= 1000 and height >= 900 and shot.stat().st_size > 20_000, (width, height)

        # ---------------------------------------------------------------- it refreshes by itself
        mark, first = page.mark(), float(shown["rendered_at"])
        page.wait_load(mark, timeout=20)
        assert float(page_numbers(page)["rendered_at"]) > first

        # ---------------------------------------------------------------- paused: every number exactly
        call(d, "POST", "/v1/samplers/pause")

        def settled() -> dict[str, Any] | None:
            a = status(d)
            time.sleep(0.5)
            b = status(d)
            keys = ("bytes", "samples", "shards", "evictions")
            same = all(a[k] == b[k] for k in keys) and a["ingest"]["commits"] == b["ingest"]["commits"]
            return b if same and b["sampler"]["in_flight"] == 0 and b["sampler"]["state"] == "paused" else None

        until(settled, 60, "sampling to settle after the pause")
        for attempt in range(5):
            before = status(d)
            page.navigate(d.url + "/")
            shown = page_numbers(page)
            after = status(d)
            if expected(before) | {"ingest_bytes_per_s": 0, "ingest_samples_per_s": 0, "disk_free": 0} == \
                    expected(after) | {"ingest_bytes_per_s": 0, "ingest_samples_per_s": 0, "disk_free": 0}:
                break
        want = expected(before)
        for name in EXACT:
            assert shown[name] == str(want[name]), (name, shown[name], want[name])
        [source] = before["sources"]  # the one source's row holds the whole cache
        assert shown["source_bytes"] == str(source["bytes"]) == shown["cache_bytes"], (shown, source)
        assert shown["source_samples"] == str(source["samples"]) == shown["samples"], (shown, source)
        assert shown["source_state"] == source["state"] == "paused"
        # the corrupt file, quarantined before its footer was read, is shown left out
        assert int(shown["coverage_units_left_out"]) >= 1 and want["coverage_row_fraction"] < 1.0, want
        for name in ("ingest_bytes_per_s", "ingest_samples_per_s"):  # a last-minute window: only decays now
            assert expected(after)[name] <= as_number(shown[name]) <= want[name], name
    assert browser.leftovers == [], f"chromium left processes behind: {browser.leftovers}"
    assert browser.proc is not None and browser.proc.poll() is not None
