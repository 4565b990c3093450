"""End to end, issue 21 item 4: samplers that die at start (pyarrow broken under a running daemon) are started
again with a backoff, not at once for ever; the crash loop shows in /healthz, /v1/status, /metrics and the log, and
ends once a sampler starts cleanly."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import sampler_pids
from paths import SUPPORT

pytestmark = pytest.mark.e2e

BROKEN = SUPPORT / "broken_pyarrow"  # its sitecustomize breaks `import pyarrow` while a flag file exists


def _metric(text: str, line: str) -> float:
    m = re.search(rf"^{re.escape(line)} (\S+)$", text, re.M)
    assert m, f"no {line} in /metrics"
    return float(m.group(1))


def test_a_broken_install_is_a_crash_loop_with_backoff_then_recovers(daemon: Any, s3: Any, tmp_path: Path,
                                                                    get: Callable[..., Any],
                                                                    until: Callable[..., Any]) -> None:
    flag = tmp_path / "break-pyarrow"
    env = {**s3.env(), "TEST_BREAK_PYARROW": str(flag),
           "PYTHONPATH": os.pathsep.join(p for p in (str(BROKEN), os.environ.get("PYTHONPATH")) if p)}
    d = daemon(samplers=1, env=env)
    pid = until(lambda: sampler_pids(d), 30, "a sampler process")[0]
    until(lambda: get(d.url + "/v1/status").json()["samples"] > 0, 60, "a first shard")

    flag.touch()  # pyarrow breaks under the running daemon; its sampler dies and every new one dies at start
    os.kill(pid, signal.SIGKILL)
    st = until(lambda: (lambda s: s if s["sampler"]["state"] == "crash loop" else None)(
        get(d.url + "/v1/status").json()), 60, "the crash loop")
    assert "before it was ready" in st["sampler"]["reason"], st["sampler"]
    health = get(d.url + "/healthz")
    assert health.status == 503 and "crash at start" in health.json()["detail"], health.body
    first = st["sampler"]["start_failures"]
    assert 5 <= first <= 6, st["sampler"]
    time.sleep(4.0)  # backed off: 8 s before the next start (at once, it was hundreds in that time)
    later = get(d.url + "/v1/status").json()["sampler"]["start_failures"]
    assert later <= first + 1, (first, later)
    metrics = get(d.url + "/metrics").body.decode()
    assert _metric(metrics, 'samplecache_sampler_state{state="crash loop"}') == 1
    assert _metric(metrics, "samplecache_sampler_start_failures_total") >= 5
    log = d.log_tail(200000)
    assert "crash loop: sampler processes crash at start" in log
    assert "ImportError: simulated broken install: cannot import pyarrow" in log  # the child's traceback

    flag.unlink()  # repaired: the next start is clean and ends the crash loop
    until(lambda: get(d.url + "/healthz").status == 200, 60, "/healthz 200 after the repair")
    st = get(d.url + "/v1/status").json()
    assert st["sampler"]["state"] != "crash loop" and sampler_pids(d), st["sampler"]
    assert "the crash loop is over" in d.log_tail(200000)
