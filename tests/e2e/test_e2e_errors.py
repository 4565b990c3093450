"""End to end, bad input: a source without Parquet files, an unreachable remote, corrupt files among good ones,
bad HTTP requests, a warm-up that cannot finish, a client without a daemon. Each gets a clear error; nothing
good is lost and the daemon keeps running."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquet_data import make_typed_table, write_dataset
from torch.utils.data import DataLoader

import samplecache
from samplecache import SampleCacheDataset

pytestmark = pytest.mark.e2e

FAST_S3 = json.dumps({"config_kwargs": {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 1}}})


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released: connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(source: str, cache_dir: Path, env: dict[str, str], timeout: float = 60) -> tuple[int, str, float]:
    """Run ``samplecache serve`` to its end (it is expected to refuse to start): (exit code, stderr, seconds)."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "samplecache_service", "serve", "--source", source,
                        "--cache-dir", str(cache_dir), "--port", str(unused_port()), "--samplers", "1"],
                       env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stderr, time.monotonic() - t0


def refusal(stderr: str) -> str:
    """The daemon's own one-line refusal (log lines of libraries filtered out)."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("samplecache serve:")]
    assert lines, f"no 'samplecache serve: ...' message on stderr:\n{stderr}"
    assert "Traceback" not in stderr, f"a raw traceback instead of a message:\n{stderr}"
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- bad sources
def test_prefix_with_no_parquet_files_is_refused(s3: Any, bucket: str, tmp_path: Path) -> None:
    s3.fs().pipe(f"{bucket}/no-parquet/README.txt", b"not a dataset\n")
    s3.fs().pipe(f"{bucket}/no-parquet/data.csv", b"a,b\n1,2\n")
    source = f"s3://{bucket}/no-parquet/"
    code, err, seconds = serve(source, tmp_path / "cache", s3.env(), timeout=30)
    msg = refusal(err)
    assert code != 0 and seconds < 30
    assert "no Parquet files" in msg and source in msg, msg


def test_empty_prefix_is_refused(s3: Any, bucket: str, tmp_path: Path) -> None:
    # On S3 an empty prefix is no object at all: "does not exist" is as right as "no Parquet files".
    source = f"s3://{bucket}/empty-prefix/"
    code, err, seconds = serve(source, tmp_path / "cache", s3.env(), timeout=30)
    msg = refusal(err)
    assert code != 0 and seconds < 30
    assert source in msg and ("no Parquet files" in msg or "does not exist" in msg), msg


@pytest.mark.parametrize("storage_options", [None, FAST_S3], ids=["default-retries", "fast-storage-options"])
def test_unreachable_remote_is_refused_with_a_message(s3: Any, typed_dataset: Any, tmp_path: Path,
                                                      storage_options: str | None) -> None:
    env = s3.env()
    dead = f"http://127.0.0.1:{unused_port()}"
    env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = dead
    if storage_options:
        env["SAMPLECACHE_STORAGE_OPTIONS"] = storage_options
    code, err, seconds = serve(typed_dataset.url, tmp_path / "cache", env, timeout=60)
    msg = refusal(err)
    assert code != 0, msg
    assert typed_dataset.url in msg and ("connect" in msg.lower() or "unreachable" in msg.lower()), msg
    # measured here: ~7.5 s with botocore's default retries, ~2 s with the storage options above (start-up
    # included); the bounds only say "gives up, and does not hang", with room for a loaded 2-core CI host
    assert seconds < (45 if storage_options is None else 30), f"took {seconds:.1f} s to give up"


@pytest.fixture
def plain_http_server(tmp_path: Path) -> Any:
    """``python -m http.server`` (it answers a ranged GET with 200 and the whole file) serving a small Parquet
    dir on a free loopback port: yields its URL, stopped at the end."""
    root = tmp_path / "www" / "data"
    root.mkdir(parents=True)
    for i in range(3):
        pq.write_table(pa.table({"id": pa.array(range(i * 100, (i + 1) * 100), pa.int64())}),
                       root / f"part-{i}.parquet", row_group_size=50)
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory",
                             str(root.parent)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (http://127.0.0.1:N/) ..."
        port = int(line.split(" port ")[1].split()[0])
        yield f"http://127.0.0.1:{port}/data/"
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_server_that_ignores_range_is_refused_and_no_file_is_quarantined(plain_http_server: str,
                                                                           tmp_path: Path) -> None:
    # before: every valid file was quarantined as corrupt (small ones by the samplers, while the daemon ran on)
    code, err, seconds = serve(plain_http_server, tmp_path / "cache", dict(os.environ), timeout=45)
    msg = refusal(err)
    assert code != 0 and seconds < 45
    assert "this server does not support HTTP Range requests" in msg and plain_http_server in msg, msg
    assert "quarantine" not in err and "corrupt" not in err, err[-2000:]


# --------------------------------------------------------------------------------------------- corrupt files
@dataclass
class MixedDataset:
    url: str
    good: pa.Table            # the 2 good files
    page_corrupt: pa.Table    # the file whose footer is fine but row group CORRUPT_RG is not
    prefix: str


CORRUPT_RG = 2
PAGE_CORRUPT_IDS = 2000


@pytest.fixture(scope="module")
def mixed_dataset(s3: Any, bucket: str) -> MixedDataset:
    """2 good files (ids 0..1199), garbage bytes, a truncated real file, and a file whose footer is intact but
    one row group's first page header is destroyed (only the sampler can find out)."""
    fs = s3.fs()
    prefix = f"{bucket}/mixed"
    good = write_dataset(fs, prefix, 2, 600, 150, seed=100)
    fs.pipe(f"{prefix}/garbage.parquet", b"\x00not parquet\xff" * 500)
    buf = io.BytesIO()
    pq.write_table(make_typed_table(600, 7, 1000), buf, row_group_size=150)
    fs.pipe(f"{prefix}/truncated.parquet", buf.getvalue()[: len(buf.getvalue()) * 2 // 3])
    page_corrupt = make_typed_table(600, 8, PAGE_CORRUPT_IDS)
    buf = io.BytesIO()
    pq.write_table(page_corrupt, buf, row_group_size=150)
    raw = bytearray(buf.getvalue())
    off = pq.ParquetFile(io.BytesIO(bytes(raw))).metadata.row_group(CORRUPT_RG).column(0).data_page_offset
    raw[off:off + 64] = b"\xff" * 64
    fs.pipe(f"{prefix}/page-corrupt.parquet", bytes(raw))
    return MixedDataset(url=f"s3://{prefix}", good=good, page_corrupt=page_corrupt, prefix=prefix)


def _settled(get: Callable[..., Any], url: str) -> Any:
    """Status once all three bad files are quarantined and every unit has been tried."""
    s = get(url + "/v1/status").json()
    cov = s.get("coverage") or {}
    # units of quarantined files never count as sampled: coverage is honest about what is left out
    ok = len(s["quarantined"]) == 3 and \
        cov.get("units_sampled", 0) + cov.get("units_left_out", 0) >= cov.get("units", 1) and \
        s["sampler"]["in_flight"] == 0
    if ok:
        assert cov["units_left_out"] > 0 and cov["row_fraction"] < 1.0, cov
        # the garbage and truncated files, quarantined at discovery (no footer, no units), count one unit each
        assert cov["files_unread"] == 2 and cov["units_left_out"] == 4 + 2, cov
        assert "whole remote dataset" not in (s["sampler"]["reason"] or ""), s["sampler"]
    return s if ok else None


def test_corrupt_files_are_quarantined_and_the_good_ones_served(daemon: Any, mixed_dataset: MixedDataset,
                                                               truth: Any, get: Callable[..., Any],
                                                               until: Callable[..., Any]) -> None:
    d = daemon(source=mixed_dataset.url)
    status = until(lambda: _settled(get, d.url), 60, "three quarantined files and every unit tried")
    assert d.proc is not None and d.proc.poll() is None, "the daemon died on corrupt input"
    assert get(d.url + "/healthz").status == 200 and get(d.url + "/readyz").status == 200

    reasons = {Path(q["path"]).name: q["reason"] for q in status["quarantined"]}
    assert set(reasons) == {"garbage.parquet", "truncated.parquet", "page-corrupt.parquet"}, reasons
    assert all(r.strip() for r in reasons.values()), reasons
    assert "footer" in reasons["garbage.parquet"] and "footer" in reasons["truncated.parquet"], reasons
    assert status["remote_errors"] >= 1 and status["last_error"], status

    good_rows = mixed_dataset.good.num_rows
    assert status["samples"] >= good_rows
    samples = list(SampleCacheDataset(d.url, min_samples=good_rows, wait=30))
    by_id = truth.expected_rows(mixed_dataset.good)
    by_id.update(truth.expected_rows(mixed_dataset.page_corrupt))
    ids = truth.check_samples(samples, by_id)
    assert len(ids) == len(set(ids)), "a sample was delivered twice"
    assert set(range(good_rows)) <= set(ids), f"good samples missing: {sorted(set(range(good_rows)) - set(ids))[:5]}"
    bad_rg = set(range(PAGE_CORRUPT_IDS + 150 * CORRUPT_RG, PAGE_CORRUPT_IDS + 150 * (CORRUPT_RG + 1)))
    extra = set(ids) - set(range(good_rows))
    assert extra <= set(range(PAGE_CORRUPT_IDS, PAGE_CORRUPT_IDS + 600)) and not extra & bad_rg, (
        "samples from the corrupt row group or from nowhere were cached")
    assert len(extra) % 150 == 0, "a partial row group of the page-corrupt file was cached"
    assert d.proc.poll() is None


def test_a_quarantined_file_lets_the_daemon_go_idle(daemon: Any, mixed_dataset: MixedDataset,
                                                   get: Callable[..., Any], until: Callable[..., Any]) -> None:
    d = daemon(source=mixed_dataset.url)
    until(lambda: _settled(get, d.url), 60, "three quarantined files and every unit tried")
    # the last ingest may still be on its way when nothing is in flight: wait for the daemon to say it is done
    until(lambda: "every readable unit is cached" in (get(d.url + "/v1/status").json()["sampler"]["reason"] or ""),
          30, "the daemon to find nothing left to sample")
    time.sleep(1.0)
    a = get(d.url + "/v1/status").json()
    time.sleep(1.0)
    b = get(d.url + "/v1/status").json()
    assert b["samples"] == a["samples"] and b["shards"] == a["shards"]
    commits = b["ingest"]["commits"] - a["ingest"]["commits"]
    cycles = b["coverage"]["cycle"] - a["coverage"]["cycle"]
    assert (commits, cycles) == (0, 0), (
        f"nothing is left to sample, yet in 1 s the daemon made {commits} LMDB commits and {cycles} passes "
        f"(sampler {b['sampler']})")
    assert b["sampler"]["state"] == "paused", b["sampler"]


# --------------------------------------------------------------------------------------------- bad requests
BAD_REQUESTS = [
    "/v1/epochs/-1",
    "/v1/epochs/abc",
    "/v1/epochs/1.5",
    "/v1/epochs/99999999999999999999999",
    "/v1/epochs/0?min_samples=-5",
    "/v1/epochs/0?min_samples=ten",
    "/v1/epochs/0?timeout=nonsense",
    "/v1/epochs/0?timeout=-1",
    "/v1/epochs/0?timeout=nan",
    "/v1/epochs/0?timeout=inf",
]


def test_bad_requests_get_a_4xx_with_a_message(daemon: Any, get: Callable[..., Any]) -> None:
    d = daemon()
    problems = []
    for path in BAD_REQUESTS:
        r = get(d.url + path, timeout=10)
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = None
        if not 400 <= r.status < 500 or not isinstance(detail, str) or not detail.strip():
            problems.append(f"{path}: {r.status} {r.body[:200]!r}")
    assert not problems, "\n".join(problems)
    far = get(d.url + "/v1/epochs/7")
    assert far.status == 409 and "7" in far.json()["detail"], far.body
    assert get(d.url + "/v1/status").json()["epochs_sealed"] == 0, "a bad request sealed an epoch"
    assert d.proc is not None and d.proc.poll() is None


def test_warmup_that_cannot_finish_is_a_503_with_retry_after(daemon: Any, typed_dataset: Any,
                                                              get: Callable[..., Any]) -> None:
    d = daemon()
    t0 = time.monotonic()
    r = get(d.url + f"/v1/epochs/0?min_samples={typed_dataset.rows * 10}&timeout=1")
    seconds = time.monotonic() - t0
    assert r.status == 503, r.body
    assert "retry-after" in r.headers and float(r.headers["retry-after"]) > 0, r.headers
    detail = r.json()["detail"]
    assert str(typed_dataset.rows * 10) in detail, detail
    assert 1.0 <= seconds < 5.0, f"answered after {seconds:.1f} s for timeout=1"
    assert get(d.url + "/v1/status").json()["epochs_sealed"] == 0, "a timed-out request sealed the epoch"
    ok = get(d.url + f"/v1/epochs/0?min_samples={typed_dataset.rows}&timeout=60")
    assert ok.status == 200 and ok.json()["samples"] == typed_dataset.rows


# --------------------------------------------------------------------------------------------- no daemon
@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "dataloader-workers"])
def test_client_without_a_daemon_raises_daemon_error_naming_the_url(workers: int) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    ds = SampleCacheDataset(url, retries=1)
    t0 = time.monotonic()
    with pytest.raises(samplecache.DaemonError) as info:
        if workers:
            next(iter(DataLoader(ds, batch_size=None, num_workers=workers)))
        else:
            next(iter(ds))
    assert url in str(info.value), str(info.value)
    assert time.monotonic() - t0 < 10
