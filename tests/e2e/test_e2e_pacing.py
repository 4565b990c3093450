"""End to end: pacing of remote traffic, measured on the wire.

A real S3 server (conftest.py) sits behind a byte-counting TCP proxy (byteproxy.py); the daemon reaches S3 only
through it, so ``proxy.downloaded`` is every byte the daemon fetched (payload and HTTP overhead). Checks:
- a full cache that nobody reads fetches nothing for 60 s (pacing=epoch, the default), even while requests without
  the token seal epoch after epoch; with the token but no lease, only a bounded number of epochs buy traffic;
- with a reader sealing epochs and leasing them, the remote bytes per epoch keep to ``replace_per_epoch`` x budget, and
  the daemon's own ``remote_bytes`` per epoch agree with the wire;
- pacing=off, by contrast, keeps replacing with no reader at all.

Dataset (own prefix): 4 files x 4 row groups of 256 rows, ``x`` = 1024 random float32 (4 KiB, incompressible),
no compression: 16 units of ~1 MiB. Every daemon runs one sampler process (a 2-core machine). Reading one unit
fetches its row group's column chunks and, once per sampler and file, the footer (its exact bytes):
~1.0 MB on the wire per 1 MB unit, so a share of 0.25 x budget buys one or two units per epoch.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from byteproxy import ByteProxy

pytestmark = pytest.mark.e2e

PREFIX = "pacing-1mib"
FILES, GROUPS_PER_FILE, ROWS_PER_GROUP, ROW_FLOATS = 4, 4, 256, 1024
UNITS = FILES * GROUPS_PER_FILE
UNIT = ROWS_PER_GROUP * (ROW_FLOATS * 4 + 8)  # ~1 MiB: the uncompressed bytes of one row group
BUDGET = 6 * UNIT + UNIT // 2                   # ~6 units resident
SHARE = 0.25
K = 4                                           # epochs the reader seals
EPOCH_EVERY = 6.0                               # s between seals (at least)
QUIET_S = 60.0                                  # the issue: "fetches nothing over 60 s"
LISTING_SLACK = 64 << 10                        # what a full idle cache may still fetch (listings only)


# ----------------------------------------------------------------------------------------------- helpers
def call(url: str, timeout: float = 60.0, method: str = "GET",
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    try:
        req = urllib.request.Request(url, method=method, headers=headers or {})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:500]


def status(d: Any) -> dict[str, Any]:
    code, body = call(d.url + "/v1/status", timeout=30)
    assert code == 200, (code, body)
    return body  # type: ignore[no-any-return]


def seal(d: Any, epoch: int, token: bool = True, lease: bool = True) -> dict[str, Any]:
    """Seal ``epoch`` as a reader does (with the token, then a lease on it, released at once: a quick reader), or
    as a bare GET."""
    code, body = call(f"{d.url}/v1/epochs/{epoch}?timeout=30", headers=d.headers if token else None)
    assert code == 200, (code, body)
    assert body["epoch"] == epoch
    if lease:
        code, got = call(f"{d.url}/v1/epochs/{epoch}/leases", method="POST", headers=d.headers)
        assert code == 201, (code, got)
        code, _ = call(f"{d.url}/v1/epochs/{epoch}/leases/{got['id']}", method="DELETE", headers=d.headers)
        assert code == 204, code
    return body  # type: ignore[no-any-return]


def wait_quiet(d: Any, proxy: ByteProxy, timeout: float, still: float = 1.5) -> dict[str, Any]:
    """Wait until the pacer holds the samplers back (a pacing reason, nothing in flight) and neither the wire
    nor the daemon's remote counter moved for ``still`` seconds; returns the last status."""
    deadline = time.monotonic() + timeout
    last: tuple[int, int] | None = None
    since = time.monotonic()
    while True:
        s = status(d)
        now = (proxy.downloaded, s["remote"]["bytes_read"])
        held = s["pacing"]["reason"] is not None and s["sampler"]["in_flight"] == 0
        if now != last or not held:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still:
            return s
        if time.monotonic() >= deadline:
            raise AssertionError(f"not quiet after {timeout} s: sampler {s['sampler']}, pacing {s['pacing']}, "
                                 f"wire {proxy.downloaded}, remote {s['remote']}")
        time.sleep(0.2)


def wait_full(d: Any, proxy: ByteProxy, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until the budget is filled and the pacer holds back the first unit that would need an eviction."""
    s = wait_quiet(d, proxy, timeout)
    assert "cache full" in (s["pacing"]["reason"] or ""), s["pacing"]
    assert s["bytes"] > s["max_bytes"] - 2 * UNIT, f"not full: {s['bytes']} of {s['max_bytes']}"
    assert s["bytes"] <= s["max_bytes"]
    return s


def make_table(n_rows: int, seed: int, id_offset: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n_rows * ROW_FLOATS, dtype=np.float32)
    return pa.table({"id": pa.array(np.arange(id_offset, id_offset + n_rows, dtype=np.int64)),
                     "x": pa.FixedSizeListArray.from_arrays(pa.array(x), ROW_FLOATS)})


@pytest.fixture(scope="module")
def pacing_source(s3: Any, bucket: str) -> str:
    fs = s3.fs()
    prefix = f"{bucket}/{PREFIX}"
    rows = GROUPS_PER_FILE * ROWS_PER_GROUP
    for i in range(FILES):
        with fs.open(f"{prefix}/part-{i:05d}.parquet", "wb") as f:
            pq.write_table(make_table(rows, 100 + i, i * rows), f, row_group_size=ROWS_PER_GROUP,
                           compression="none", use_dictionary=False)
    return f"s3://{prefix}"


@pytest.fixture
def proxy(s3: Any) -> Iterator[ByteProxy]:
    """Set up before ``daemon`` in every test below, so torn down after the daemons are stopped."""
    p = ByteProxy(s3.port)
    with p:
        yield p
    assert not p.alive, "the proxy thread is still running"


def proxied_env(s3: Any, proxy: ByteProxy) -> dict[str, str]:
    env = s3.env()
    assert env["AWS_ENDPOINT_URL"] == s3.endpoint
    env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = proxy.endpoint
    return env


def start(daemon: Callable[..., Any], s3: Any, proxy: ByteProxy, source: str, *extra: str) -> Any:
    d = daemon(source, samplers=1, env=proxied_env(s3, proxy),
               extra=["--max-bytes", str(BUDGET), *extra])
    return d


# ----------------------------------------------------------------------------------------------- tests
def test_proxy_counts_and_closes(s3: Any, bucket: str, pacing_source: str) -> None:
    """The measuring instrument: every byte of a download crosses it, and it leaves no thread behind."""
    import s3fs

    with ByteProxy(s3.port) as p:
        fs = s3fs.S3FileSystem(key=s3.key, secret=s3.secret, client_kwargs={"endpoint_url": p.endpoint},
                               skip_instance_cache=True, use_listings_cache=False)
        path = f"{pacing_source[len('s3://'):]}/part-00000.parquet"
        size = fs.info(path)["size"]
        p.reset()
        data = fs.cat_file(path)
        assert len(data) == size
        assert size <= p.downloaded <= size + (16 << 10), (size, p.downloaded)
        assert p.uploaded > 0 and p.connections >= 1
    assert not p.alive


def test_full_cache_with_no_reader_fetches_nothing(s3: Any, proxy: ByteProxy, daemon: Callable[..., Any],
                                                   pacing_source: str) -> None:
    d = start(daemon, s3, proxy, pacing_source)
    full = wait_full(d, proxy)
    assert full["pacing"]["mode"] == "epoch" and full["last_epoch"] == -1
    wire0, remote0, ev0 = proxy.downloaded, full["remote"]["bytes_read"], full["evictions"]
    assert wire0 >= full["bytes"], "the cache filled without its bytes crossing the proxy"
    deadline = time.monotonic() + QUIET_S
    sealed = 0
    while time.monotonic() < deadline:
        time.sleep(2.0)
        # anyone on the host may GET a manifest: without the token it seals, but buys no remote traffic
        seal(d, sealed, token=False, lease=False)
        sealed += 1
        s = status(d)
        assert proxy.downloaded - wire0 < LISTING_SLACK, (
            f"a full cache with no reader fetched {proxy.downloaded - wire0} bytes; sampler {s['sampler']}")
        assert s["remote"]["bytes_read"] == remote0 and s["evictions"] == ev0, (s["remote"], s["evictions"])
    s = status(d)
    assert "cache full" in (s["sampler"]["reason"] or ""), s["sampler"]
    assert s["pacing"]["allowance_bytes"] <= 0 and s["last_epoch"] == sealed - 1
    print(f"\nfull at {full['bytes']} of {full['max_bytes']} bytes after {wire0} wire bytes; "
          f"{proxy.downloaded - wire0} wire bytes in {QUIET_S:.0f} s idle, {sealed} epochs sealed without the token")
    # with the token but never a lease: the first UNREAD_GRANTS (2) epochs buy a share each, the rest nothing
    wire1 = proxy.downloaded
    for _ in range(6):
        seal(d, sealed, lease=False)
        sealed += 1
    s = wait_quiet(d, proxy, timeout=30)
    share = 0.2 * s["max_bytes"]  # --replace-per-epoch's default
    per_unit = full["remote"]["bytes_read"] / max(1, full["shards"])
    assert proxy.downloaded - wire1 <= 2 * (share + per_unit) + (1 << 20), (proxy.downloaded - wire1, share)


def test_reader_epochs_keep_to_the_share(s3: Any, proxy: ByteProxy, daemon: Callable[..., Any],
                                         pacing_source: str) -> None:
    """A reader seals an epoch every EPOCH_EVERY s (or later, once the pacer has spent the share and holds
    back): the wire bytes after each seal stay within one share (plus the one unit that may overshoot it:
    a unit is fetched once the allowance covers its estimate, and settled with its real bytes), and over K
    epochs within K shares; the daemon's per-epoch ``remote_bytes`` match the wire."""
    d = start(daemon, s3, proxy, pacing_source, "--replace-per-epoch", str(SHARE))
    full = wait_full(d, proxy)
    share = SHARE * full["max_bytes"]
    per_unit = full["remote"]["bytes_read"] / max(1, full["shards"])  # the row group (+ its footer once per file)
    ev0 = full["evictions"]
    wires, remotes, allowances = [], [], []
    for e in range(K):
        w0, t0 = proxy.downloaded, time.monotonic()
        seal(d, e)
        s = wait_quiet(d, proxy, timeout=20)
        time.sleep(max(0.0, EPOCH_EVERY - (time.monotonic() - t0)))
        s = wait_quiet(d, proxy, timeout=20)
        wires.append(proxy.downloaded - w0)
        remotes.append(s["remote"]["bytes_since_last_epoch"])
        allowances.append(s["pacing"]["allowance_bytes"])
    seal(d, K)  # its summary holds what was fetched after epoch K-1
    s = status(d)
    summaries = {x["epoch"]: x for x in s["epochs"]}
    daemon_per_epoch = [summaries[e + 1]["remote_bytes"] for e in range(K)]
    print(f"\nbudget {full['max_bytes']}, share {share:.0f}, ~{per_unit:.0f} remote bytes per unit; wire per "
          f"epoch {wires} (sum {sum(wires)} of {K * share:.0f}); daemon per epoch {daemon_per_epoch}; allowance "
          f"after each {allowances}; evictions {s['evictions'] - ev0}")
    for e, w in enumerate(wires):
        assert w <= share + per_unit + (1 << 20), f"epoch {e}: {w} wire bytes > share {share:.0f} + one unit"
    assert sum(wires) <= K * share + 2 * per_unit, f"{sum(wires)} wire bytes over {K} epochs > {K} shares"
    assert sum(wires) >= per_unit and s["evictions"] > ev0, "no replacement happened"
    assert all(a <= share for a in allowances), allowances  # held back with less than a share left
    for e in range(K):
        assert daemon_per_epoch[e] == remotes[e], (e, daemon_per_epoch[e], remotes[e])
        # the wire adds HTTP headers (and any listing); the daemon counts payload only
        assert 0.8 * wires[e] - (16 << 10) <= daemon_per_epoch[e] <= wires[e], (e, daemon_per_epoch[e], wires[e])
    assert s["bytes"] <= s["max_bytes"]


def test_pacing_off_replaces_without_a_reader(s3: Any, proxy: ByteProxy, daemon: Callable[..., Any],
                                              pacing_source: str, until: Callable[..., Any]) -> None:
    d = start(daemon, s3, proxy, pacing_source, "--pacing", "off")
    until(lambda: status(d)["evictions"] > 0, 60, "the budget to fill")
    s0, w0 = status(d), proxy.downloaded
    # a unit arrives as several parts (part_bytes is budget/16 here) and each part may evict, so evictions alone
    # can advance on one download: wait for both the evictions and the wire to move by two units
    until(lambda: status(d)["evictions"] >= s0["evictions"] + 3 and proxy.downloaded - w0 >= 2 * UNIT, 30,
          "evictions and downloads with no reader (pacing off)")
    s = status(d)
    assert s["pacing"]["mode"] == "off" and s["last_epoch"] == -1
    assert proxy.downloaded - w0 >= 2 * UNIT
    assert s["bytes"] <= s["max_bytes"]
    print(f"\npacing off: {s['evictions'] - s0['evictions']} evictions, {proxy.downloaded - w0} wire bytes with "
          f"no reader")
