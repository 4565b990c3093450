"""Talking to the daemon over HTTP (stdlib only): manifests, with bounded retries."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from typing import Any


class DaemonError(RuntimeError):
    """The daemon refused a request or could not be reached; the message says which and why. ``status`` is
    the HTTP status of a refusal (None when the daemon could not be reached), ``body`` its JSON body."""

    def __init__(self, message: str, status: int | None = None, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, body or {}


class EpochGone(DaemonError):
    """The job's epoch can no longer be read (its leases ended and its shards were evicted, e.g. after a long
    outage). ``next_epoch`` is where the job can go on: ``ds.set_epoch(e.next_epoch)``."""

    @property
    def next_epoch(self) -> int:
        if "next_epoch" in self.body:
            return int(self.body["next_epoch"])
        # re-raised from a DataLoader worker, only the message travelled: the daemon names the epoch in it
        found = re.search(r"set_epoch\((\d+)\)", str(self))
        if found is None:
            raise AttributeError(f"this error names no next epoch: {self}")
        return int(found.group(1))


def _problem(body: bytes) -> tuple[str, dict[str, Any]]:
    """The refusal's message and its JSON body (empty when it is not a JSON object)."""
    try:
        got = json.loads(body)
        if isinstance(got, dict):
            return str(got.get("detail", body[:500].decode(errors="replace"))), got
    except ValueError:
        pass
    return body[:500].decode(errors="replace"), {}


def request_json(url: str, method: str = "GET", token: str | None = None, body: Any = None,
                 timeout: float = 60.0, retries: int = 5, backoff: float = 0.5) -> Any:
    """One JSON request; retries connection failures and 503s (bounded), raises DaemonError."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    last = ""
    for attempt in range(retries + 1):
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            detail, problem = _problem(e.read())
            if e.code != 503:
                kind = EpochGone if e.code == 410 and "next_epoch" in problem else DaemonError
                raise kind(f"samplecache daemon at {url} answered {e.code}: {detail}", e.code, problem) from None
            last = f"{e.code}: {detail}"
            wait = float(e.headers.get("Retry-After") or backoff * 2 ** attempt)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            last = f"cannot connect: {reason}"
            wait = backoff * 2 ** attempt
        if attempt < retries:
            time.sleep(min(wait, 10.0))
    raise DaemonError(f"samplecache daemon at {url} is not available after {retries + 1} attempts ({last}); "
                      f"is `samplecache serve` running there?")


def fetch_manifest(base_url: str, epoch: int, min_samples: int = 1, wait: float = 30.0,
                   token: str | None = None, retries: int = 5) -> dict[str, Any]:
    url = (f"{base_url.rstrip('/')}/v1/epochs/{int(epoch)}?min_samples={int(min_samples)}&timeout={wait}"
           f"&format=compact")
    return request_json(url, token=token, timeout=wait + 30.0, retries=retries)  # type: ignore[no-any-return]
