"""Watching a running daemon from outside, for end-to-end tests: HTTP calls that carry its token when it keeps
one, a status log polled in a thread, and the check that status never claims coverage the cache lacks."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

WHOLE = "the whole remote dataset is cached"


def auth(d: Any) -> dict[str, str]:
    """``Authorization`` for a daemon that keeps a token file in its cache dir (none when it has none)."""
    path = Path(d.cache_dir) / "api-token"
    return {"Authorization": f"Bearer {path.read_text().strip()}"} if path.exists() else {}


def call(d: Any, path: str, method: str = "GET", timeout: float = 10.0) -> tuple[int, Any]:
    req = urllib.request.Request(d.url + path, method=method, headers=auth(d))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:300]


def status(d: Any) -> dict[str, Any]:
    code, body = call(d, "/v1/status")
    assert code == 200, (code, body)
    return body  # type: ignore[no-any-return]


class StatusLog:
    """Polls /v1/status (and /healthz) every ``every`` s in a thread; keeps every sample."""

    def __init__(self, d: Any, every: float = 0.2) -> None:
        self.d, self.every = d, every
        self.samples: list[dict[str, Any]] = []
        self.health: list[tuple[float, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-log", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.samples.append(status(self.d))
                code, _ = call(self.d, "/healthz", timeout=5)
                self.health.append((time.monotonic(), code))
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(f"{type(e).__name__}: {e}")

    @property
    def last(self) -> dict[str, Any]:
        return self.samples[-1] if self.samples else status(self.d)

    def __enter__(self) -> "StatusLog":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return got


def dishonest(log: StatusLog, rows: int) -> list[str]:
    """Status samples that claim coverage the cache does not have: while a unit is not resident (fewer resident
    samples than the dataset's rows, in this sample and the next one: a status snapshot need not be atomic),
    nothing may say the whole dataset is cached and ``row_fraction`` must stay below 1.0."""
    bad = []
    for s, after in zip(log.samples, log.samples[1:] + [log.samples[-1]]):
        if s["samples"] < rows and after["samples"] < rows:
            fraction = (s.get("coverage") or {}).get("row_fraction", 0.0)
            if WHOLE in json.dumps(s) or fraction >= 1.0:
                bad.append(f"{s['samples']} of {rows} rows resident, yet row_fraction {fraction}, sampler "
                           f"{s['sampler']}, quarantined {[q['path'] for q in s['quarantined']]}")
    return bad
