"""Talking to the daemon over HTTP (stdlib only): every call bounded in time.

Each request has a connect timeout and a read timeout; each logical call (fetch a manifest, take a lease,
attach to a job) has a total budget, its *deadline*, over all its attempts, retried with exponential backoff
and jitter. A long poll (``wait``) may take its wait on top of the deadline, no more. Past the budget a
``DaemonError`` names the URL, what was being done, the attempts and the last error, so a stopped daemon (one
that accepts connections and never answers) fails the training loop instead of hanging it. A refused connection
is no slow daemon but none at all: refused for ``REFUSED_FOR`` seconds in a row, the call raises, saying that no
daemon is running at that URL (a daemon that restarts has those seconds to listen again).

Not retried: a URL that is not ``http(s)://host[:port]`` (a ``ValueError`` at once) and a 4xx refusal other
than 408/429 (a ``DaemonError`` at once, with the daemon's ``detail``). The token sent with each request is
the one given, or the one ``samplecache.api.auth`` finds through the daemon.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import time
from typing import Any
from urllib.parse import SplitResult, urlsplit

DEFAULT_DEADLINE = 60.0  # seconds per logical call, all attempts together (SAMPLECACHE_DEADLINE)
CONNECT_TIMEOUT = 5.0  # seconds to open the TCP connection
READ_TIMEOUT = 30.0  # seconds to wait for the answer (beyond a long poll's wait)
FIRST_BACKOFF, MAX_BACKOFF = 0.2, 5.0  # seconds before the 2nd attempt, and the most between two
REFUSED_FOR = 3.0  # seconds of refused connections in a row that say no daemon is running there
RETRIED = (408, 429, 502, 503, 504)  # answers worth another attempt; any other refusal is final


class DaemonError(RuntimeError):
    """The daemon refused a request or could not be reached in time; the message says which and why.

    A ``RuntimeError`` (not a ``ConnectionError``: a refusal is not a connection problem, and an ``OSError``
    handler must not swallow it). ``status`` is the HTTP status of a refusal (None when no answer came),
    ``body`` its JSON body, ``attempts`` how many requests were made."""

    def __init__(self, message: str, status: int | None = None, body: dict[str, Any] | None = None,
                 attempts: int | None = None) -> None:
        super().__init__(message)
        self.status, self.body, self.attempts = status, body or {}, attempts


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


def daemon_url(url: str) -> str:
    """``url`` without a trailing slash, or ValueError when it cannot name a daemon (``http(s)://host[:port]``)."""
    parts = urlsplit(str(url))
    if parts.scheme not in ("http", "https"):
        hint = f"; did you mean 'http://{url}'?" if "://" not in str(url) else ""
        raise ValueError(f"the samplecache daemon URL must start with http:// or https://, not {url!r}{hint}")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as e:
        raise ValueError(f"bad samplecache daemon URL {url!r}: {e}") from None
    if not parts.hostname:
        raise ValueError(f"the samplecache daemon URL {url!r} names no host (e.g. http://127.0.0.1:8750)")
    return str(url).rstrip("/")


def base_of(url: str) -> str:
    """The daemon's base URL from any of its endpoint URLs."""
    return url.split("/v1/", 1)[0].rstrip("/")


def deadline_setting(value: float | str | None, default: float = DEFAULT_DEADLINE) -> float:
    """A deadline in seconds (> 0), from an argument or SAMPLECACHE_DEADLINE's text; ``default`` for None."""
    if value is None or value == "":
        return default
    try:
        got = float(value)
    except ValueError:
        raise ValueError(f"the deadline (SAMPLECACHE_DEADLINE) must be a number of seconds, not {value!r}") from None
    if not 0 < got < float("inf"):
        raise ValueError(f"the deadline (SAMPLECACHE_DEADLINE) must be > 0 seconds, not {value!r}")
    return got


def _problem(body: bytes) -> tuple[str, dict[str, Any]]:
    """The refusal's message and its JSON body (empty when it is not a JSON object)."""
    try:
        got = json.loads(body)
        if isinstance(got, dict):
            return str(got.get("detail", body[:500].decode(errors="replace"))), got
    except ValueError:
        pass
    return body[:500].decode(errors="replace"), {}


class _NoConnection(Exception):
    """The TCP connection could not be made (refused, unreachable, timed out); ``refused``: nothing listens."""

    def __init__(self, message: str, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


def _exchange(parts: SplitResult, method: str, data: bytes | None, headers: dict[str, str],
              connect_s: float, read_until: float) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request: connected within ``connect_s``, the whole answer read by ``read_until`` (monotonic)."""
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "", parts.port, timeout=max(0.001, connect_s))
    try:
        try:
            conn.connect()
        except OSError as e:
            why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
            raise _NoConnection(why, isinstance(e, ConnectionRefusedError)) from e
        sock = conn.sock
        assert sock is not None
        sock.settimeout(max(0.001, read_until - time.monotonic()))
        conn.request(method, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body=data,
                     headers=headers)
        resp = conn.getresponse()
        chunks = []
        while not resp.isclosed():  # the whole answer by read_until, however slowly it trickles
            left = read_until - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            if sock.fileno() >= 0:  # (a response read to its end closes the socket)
                sock.settimeout(left)
            chunk = resp.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return resp.status, resp.headers, b"".join(chunks)
    finally:
        conn.close()


def request_json(url: str, method: str = "GET", token: str | None = None, body: Any = None, *,
                 deadline: float = DEFAULT_DEADLINE, wait: float = 0.0, retries: int | None = None,
                 what: str | None = None, discover: bool = True) -> Any:
    """One logical JSON call: attempts until an answer, a final refusal, ``retries`` + 1 attempts or
    ``deadline`` (+ ``wait`` for a long poll) seconds. Raises DaemonError (ValueError for a bad URL).
    ``token``: sent as a bearer token; None finds one through ``samplecache.api.auth`` (unless ``discover``
    is False), and a 401 to a found token reads it again once."""
    from samplecache.api import auth  # auth calls back into this module

    parts = urlsplit(daemon_url(url))
    what = what or f"{method} {parts.path}"
    wait = max(0.0, float(wait))
    start = time.monotonic()
    end = start + deadline + wait
    base = base_of(url)
    found = token is None and discover
    if found:
        token = auth.token_for(base, start + deadline, retries, what)
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json", "Connection": "close"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    attempts, last, answered, reread = 0, "", "", False
    refused_since: float | None = None  # when the refusals in a row began
    while True:
        if token:
            headers["Authorization"] = f"Bearer {token}"
        attempts += 1
        now = time.monotonic()
        read_until = min(now + wait + READ_TIMEOUT, end)
        pause = FIRST_BACKOFF * 2 ** (attempts - 1)
        try:
            status, reply_headers, raw = _exchange(parts, method, data, headers, min(CONNECT_TIMEOUT, end - now),
                                                   read_until)
        except _NoConnection as e:
            last = f"cannot connect: {e}"
            refused_since = (now if refused_since is None else refused_since) if e.refused else None
        except TimeoutError:
            refused_since = None
            last = f"no answer within {read_until - now:.1f} s (read timeout: is the daemon stopped or overloaded?)"
        except (OSError, http.client.HTTPException) as e:
            refused_since = None
            last = f"the connection broke: {e!r}"
        else:
            refused_since = None
            if 200 <= status < 300:
                return json.loads(raw) if raw else None
            detail, problem = _problem(raw)
            if status == 401 and found and not reread:
                reread, token = True, auth.refresh(base, end, retries, what)
                if token:
                    continue  # the daemon may have restarted with a new token: once more, with that one
            if status not in RETRIED:
                kind = EpochGone if status == 410 and "next_epoch" in problem else DaemonError
                hint = auth.hint(base) if status == 401 else ""
                raise kind(f"samplecache daemon at {url} answered {status} ({what}): {detail}{hint}", status,
                           problem, attempts) from None
            last = answered = f"{status}: {detail}"
            try:
                pause = max(pause, float(reply_headers.get("Retry-After") or 0))
            except ValueError:
                pass
        # exponential backoff with jitter (ranks that failed together do not retry together); no attempt is
        # started that the budget leaves no time for
        pause = min(MAX_BACKOFF, pause) * random.uniform(0.5, 1.0)
        if (retries is not None and attempts > retries) or pause + 0.05 > end - time.monotonic():
            break
        if refused_since is not None and time.monotonic() + pause - refused_since > REFUSED_FOR:
            break  # nothing listens there: no daemon is running, however long the deadline
        time.sleep(pause)
    took = time.monotonic() - start
    tries = f"{attempts} attempt{'s' if attempts > 1 else ''}"
    if refused_since is not None:
        refused = time.monotonic() - refused_since
        raise DaemonError(f"samplecache daemon at {url} is not running ({what}): connections refused for "
                          f"{refused:.1f} s ({tries} in {took:.1f} s; last error: {last}). Start `samplecache serve` "
                          f"there, or check the URL", None, None, attempts) from None
    also = f"; the daemon last answered {answered}" if answered and answered != last else ""
    budget = f"deadline {deadline:.3g} s" + (f" + wait {wait:.3g} s" if wait else "")
    raise DaemonError(f"samplecache daemon at {url} is not available ({what}): {tries} in {took:.1f} s "
                      f"({budget}); last error: {last}{also}. Is `samplecache serve` running (and not stopped) "
                      f"there?", None, None, attempts) from None


def fetch_manifest(base_url: str, epoch: int, min_samples: int = 1, wait: float = 30.0,
                   token: str | None = None, retries: int | None = None,
                   deadline: float = DEFAULT_DEADLINE) -> dict[str, Any]:
    """Daemon epoch ``epoch``'s manifest (compact form), waiting up to ``wait`` s for ``min_samples``."""
    url = (f"{daemon_url(base_url)}/v1/epochs/{int(epoch)}?min_samples={int(min_samples)}&timeout={wait}"
           f"&format=compact")
    return request_json(url, token=token, retries=retries, deadline=deadline,  # type: ignore[no-any-return]
                        wait=wait, what=f"fetching the manifest of daemon epoch {int(epoch)}")
