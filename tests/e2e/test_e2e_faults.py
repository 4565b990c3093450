"""End to end, faults between the daemon and a real S3 server (SeaweedFS behind faultproxy.py), and in the daemon's
own sampler processes. What must hold (issue 11; DESIGN.md invariants 8 and 10):

a. through 30% mid-response resets and 50 ms latency, ingest goes on; a 60 s outage stops it, and it recovers
   by itself after, with no restart: 0 files quarantined, 0 partial shards, ``/healthz`` 200 throughout;
b. 40 SIGKILLs of sampler processes during ingest, a 403 AccessDenied on one file for 10 s, a file deleted and
   restored 10 s later: 0 healthy files quarantined, and coverage honest at every status sample (~0.2 s);
c. a file of garbage bytes is quarantined with a reason; once replaced by valid Parquet it leaves quarantine by
   itself and its rows are cached;
d. a healthy file replaced in place while it is sampled (longer, its chunks at other offsets) is never
   quarantined: a sampler that cannot parse it at its listed size finds the size changed, the daemon lists the
   source again at once and samples the file as it is now.

Datasets are small (2 cores): files of a few row groups of 64 rows x 1 KiB (one ~64 KiB shard per row group),
a budget that holds everything (so "resident" and "sampled" agree), short discovery and retry intervals. Each
test prints its figures; daemon_watch.py polls status and checks its honesty.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cache_check import check_cache
from conftest import sampler_pids
from daemon_watch import StatusLog, call, dishonest, status, wait_for
from faultproxy import ErrorRule, FaultProxy

pytestmark = pytest.mark.e2e

ROWS_PER_GROUP, ROW_FLOATS = 64, 256
BUDGET = str(32 << 20)
FAST = ["--max-bytes", BUDGET, "--discover-interval", "2", "--retry-seconds", "1"]
OUTAGE_S = 60.0  # the figure
KILLS = 40


# ----------------------------------------------------------------------------------------------- data
def parquet_file(rows: int, first_id: int, compression: str = "none") -> bytes:
    """Rows ``id`` = first_id.., ``x`` = 256 random float32 (1 KiB, incompressible); row groups of 64 rows."""
    x = np.random.default_rng(first_id).standard_normal(rows * ROW_FLOATS, dtype=np.float32)
    t = pa.table({"id": pa.array(np.arange(first_id, first_id + rows, dtype=np.int64)),
                  "x": pa.FixedSizeListArray.from_arrays(pa.array(x), ROW_FLOATS)})
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, row_group_size=ROWS_PER_GROUP, compression=compression, use_dictionary=False)
    return bytes(sink.getvalue())


class Dataset:
    """``files`` Parquet files of ``groups`` row groups under ``bucket/prefix``; file i holds ids from i * 10000."""

    def __init__(self, s3: Any, bucket: str, prefix: str, files: int, groups: int) -> None:
        self.fs, self.prefix, self.url = s3.fs(), f"{bucket}/{prefix}", f"s3://{bucket}/{prefix}"
        self.raw: dict[str, bytes] = {}
        self.first_id: dict[str, int] = {}
        self.file_rows: dict[str, int] = {}
        for i in range(files):
            self.put(f"part-{i:05d}.parquet", i * 10000, groups)

    def put(self, name: str, first_id: int, groups: int, compression: str = "none") -> None:
        self.raw[name] = parquet_file(groups * ROWS_PER_GROUP, first_id, compression)
        self.first_id[name] = first_id
        self.file_rows[name] = groups * ROWS_PER_GROUP
        self.fs.pipe(f"{self.prefix}/{name}", self.raw[name])

    @property
    def rows(self) -> int:
        return sum(self.file_rows.values())

    def expect_ids(self, shard: dict[str, Any]) -> np.ndarray:
        start = self.first_id[Path(shard["path"]).name] + int(shard["first_row"])
        return np.arange(start, start + int(shard["rows"]), dtype=np.int64)


# ----------------------------------------------------------------------------------------------- daemon calls
def quarantine_api(d: Any) -> list[str]:
    """The paths GET /v1/quarantine lists (asserting the endpoint answers)."""
    code, body = call(d, "/v1/quarantine")
    assert code == 200, f"GET /v1/quarantine: {code} {body!r}"
    return [f["path"] for f in body["files"]]


def quarantine_problems(d: Any) -> list[str]:
    try:
        listed = quarantine_api(d)
    except AssertionError as e:
        return [str(e)]
    return [f"GET /v1/quarantine lists {listed}"] if listed else []


def proxied(s3: Any, proxy: FaultProxy) -> dict[str, str]:
    env: dict[str, str] = s3.env()
    env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = proxy.endpoint
    return env


def figures(name: str, **kw: Any) -> None:
    print(f"\n[{name}] " + ", ".join(f"{k}={v}" for k, v in kw.items()))


@pytest.fixture
def proxy(s3: Any) -> Iterator[FaultProxy]:
    """Set up before ``daemon``, so torn down after the daemons are stopped."""
    with FaultProxy(s3.port, seed=11) as p:
        yield p
    assert not p.alive


# ----------------------------------------------------------------------------------------------- a
@pytest.fixture(scope="module")
def data_a(s3: Any, bucket: str) -> Dataset:
    return Dataset(s3, bucket, "faults-a", files=4, groups=6)


def test_resets_latency_and_an_outage(s3: Any, proxy: FaultProxy, daemon: Any, data_a: Dataset) -> None:
    proxy.latency, proxy.reset_probability = 0.05, 0.30
    d = daemon(data_a.url, samplers=1, env=proxied(s3, proxy), extra=FAST, timeout=120)
    target = data_a.rows // 3
    problems: list[str] = []
    with StatusLog(d, every=0.5) as log:
        t0 = time.monotonic()
        wait_for(lambda: log.last["samples"] >= target, 180, f"{target} samples through resets and latency")
        fill_s, before = time.monotonic() - t0, log.last
        assert before["samples"] < data_a.rows, "the whole dataset was cached before the outage: size it up"
        proxy.outage(OUTAGE_S)
        time.sleep(OUTAGE_S)
        during = log.last
        t1 = time.monotonic()
        first = wait_for(lambda: log.last["shards"] > during["shards"] and log.last, 120, "a shard after the outage")
        recover_s = time.monotonic() - t1
        try:
            wait_for(lambda: log.last["samples"] >= data_a.rows, 180, "every row after the outage")
        except AssertionError as e:
            problems.append(str(e))
        done_s = time.monotonic() - t1
    end = status(d)
    unhealthy = [(round(t - t0, 1), c) for t, c in log.health if c != 200]
    stats = proxy.stats()
    figures("a", fill_s=f"{fill_s:.1f}", samples_before=before["samples"], shards_before=before["shards"],
            shards_after_outage=during["shards"], first_shard_after_s=f"{recover_s:.1f}",
            all_rows_after_s=f"{done_s:.1f}", samples=end["samples"], rows=data_a.rows, shards=end["shards"],
            remote_errors=end["remote_errors"], quarantined=len(end["quarantined"]),
            restarts=end["sampler"]["restarts"], unhealthy=len(unhealthy), proxy=stats)
    assert stats["resets"] > 0 and stats["outage_resets"] > 0, stats
    if end["quarantined"]:
        problems.append(f"quarantined: {end['quarantined']}")
    if end["samples"] != data_a.rows:
        problems.append(f"{end['samples']} of {data_a.rows} rows resident (sampler {end['sampler']})")
    if unhealthy or log.errors:
        problems.append(f"/healthz not 200 (s since start, code): {unhealthy[:10]}; poll errors {log.errors[:3]}")
    problems += quarantine_problems(d)
    assert d.proc.poll() is None and first["shards"] > during["shards"]
    check_cache(d.cache_dir, expect_ids=data_a.expect_ids)  # 0 partial shards, each the rows of its unit
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------- b
@pytest.fixture(scope="module")
def data_b(s3: Any, bucket: str) -> Dataset:
    return Dataset(s3, bucket, "faults-b", files=4, groups=8)


def least_sampled(d: Any, data: Dataset, besides: str = "") -> str:
    """The file with the fewest resident shards (the one whose units are most likely still to be read)."""
    code, page = call(d, "/v1/shards?limit=1000")
    assert code == 200, (code, page)
    counts = collections.Counter(Path(s["path"]).name for s in page["shards"])
    return min((n for n in data.raw if n != besides), key=lambda n: (counts[n], n))


class Faults:
    """Test b's two remote faults, each started at a given kill and ended 10 s after the daemon first met it:
    a 403 AccessDenied on one file (synthetic, from the proxy) and a file deleted from S3, then restored."""

    def __init__(self, d: Any, data: Dataset, proxy: FaultProxy) -> None:
        self.d, self.data, self.proxy, self.t0 = d, data, proxy, time.monotonic()
        self.rule: ErrorRule | None = None
        self.denied = self.deleted = ""
        self.deleted_at = 0.0
        self.restored = False
        self.events: list[str] = []

    def event(self, what: str) -> None:
        self.events.append(f"{what} at {time.monotonic() - self.t0:.1f} s")

    def key(self, name: str) -> str:
        return rf"{self.data.prefix}/{name}$"

    def step(self, kills: int) -> None:
        if kills >= 10 and self.rule is None:
            self.denied = least_sampled(self.d, self.data)
            self.rule = self.proxy.answer_error(self.key(self.denied), 3600, 403)  # until 10 s after its first hit
            self.event(f"403 on {self.denied}")
        if self.rule is not None and self.rule.first_hit and self.rule.until > self.rule.first_hit + 10:
            self.rule.until = self.rule.first_hit + 10
            self.event("the daemon met the 403")
        if kills >= 10 and not self.deleted:  # with the 403: by kill 20 a faster ingest had read every other file
            self.deleted = least_sampled(self.d, self.data, besides=self.denied)
            self.data.fs.rm(f"{self.data.prefix}/{self.deleted}")
            self.deleted_at = time.monotonic()
            self.event(f"deleted {self.deleted}")
        met = self.proxy.requests_for(self.key(self.deleted), self.deleted_at) if self.deleted else []
        if met and not self.restored and time.monotonic() >= met[0][0] + 10:
            self.data.fs.pipe(f"{self.data.prefix}/{self.deleted}", self.data.raw[self.deleted])
            self.restored = True
            self.event(f"restored {self.deleted} ({len(met)} requests for it while it was gone)")

    @property
    def over(self) -> bool:
        return self.rule is not None and not self.rule.active and self.restored

    def give_up(self) -> str:
        """End both faults now (the daemon never met one: it no longer reads that file); says which."""
        missed = [f"403 on {self.denied}" for r in [self.rule] if r is not None and r.active]
        if self.rule is not None:
            self.rule.until = 0.0
        if self.deleted and not self.restored:
            self.data.fs.pipe(f"{self.data.prefix}/{self.deleted}", self.data.raw[self.deleted])
            self.restored = True
            missed.append(f"{self.deleted} deleted")
        return f"the daemon never read the file while it was faulty ({missed}): {self.events}"


def test_sampler_kills_denied_and_deleted_files(s3: Any, proxy: FaultProxy, daemon: Any, data_b: Dataset) -> None:
    proxy.latency = 0.1
    d = daemon(data_b.url, samplers=2, env=proxied(s3, proxy), extra=FAST, timeout=120)
    rng = random.Random(5)
    faults = Faults(d, data_b, proxy)
    kills = busy = 0
    problems: list[str] = []
    with StatusLog(d) as log:
        wait_for(lambda: len(sampler_pids(d)) >= 2, 60, "two sampler processes")
        t0 = time.monotonic()
        while kills < KILLS or not faults.over:
            faults.step(kills)
            if time.monotonic() - t0 > 150:
                problems.append(faults.give_up())
            if kills >= KILLS:
                time.sleep(0.2)
                continue
            assert log.last["samples"] < data_b.rows, (
                f"ingest ended after {kills} kills: the kills are not spread over it (size the dataset up)")
            with contextlib.suppress(AssertionError):  # a sampler at work, unless every unit waits out a backoff
                wait_for(lambda: log.last["sampler"]["in_flight"] > 0, 2, "work in flight", every=0.05)
            pids = wait_for(lambda: sampler_pids(d), 30, "a sampler process")
            busy += log.last["sampler"]["in_flight"] > 0
            os.kill(rng.choice(pids), signal.SIGKILL)
            kills += 1
            time.sleep(rng.uniform(0.3, 1.2))
        kills_s = time.monotonic() - t0
        try:
            wait_for(lambda: log.last["samples"] >= data_b.rows, 120, "every row after the faults")
        except AssertionError as e:
            problems.append(str(e))
        time.sleep(1.0)
    end = status(d)
    ever = sorted({q["path"] for s in log.samples for q in s["quarantined"]})
    lies = dishonest(log, data_b.rows)
    assert faults.rule is not None
    figures("b", kills=kills, kills_with_work_in_flight=busy, faults_over_s=f"{kills_s:.1f}",
            all_rows_s=f"{time.monotonic() - t0:.1f}", samples=end["samples"], rows=data_b.rows,
            restarts=end["sampler"]["restarts"], remote_errors=end["remote_errors"], ever_quarantined=ever,
            status_samples=len(log.samples), dishonest_samples=len(lies), answered_403=faults.rule.hits,
            events=faults.events, proxy=proxy.stats())
    if busy < KILLS // 2:
        problems.append(f"only {busy} of {kills} kills hit a daemon with work in flight")
    if ever:
        problems.append(f"healthy files quarantined: {ever}; reasons {end['quarantined']}")
    if lies:
        problems.append(f"{len(lies)} of {len(log.samples)} status samples claim coverage it lacks, first: "
                        + "\n  ".join(lies[:3]))
    if end["samples"] != data_b.rows:
        problems.append(f"{end['samples']} of {data_b.rows} rows resident (sampler {end['sampler']})")
    problems += quarantine_problems(d)
    assert not log.errors, log.errors[:3]
    check_cache(d.cache_dir, expect_ids=data_b.expect_ids)
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------- c
@pytest.fixture(scope="module")
def data_c(s3: Any, bucket: str) -> Dataset:
    data = Dataset(s3, bucket, "faults-c", files=2, groups=3)
    data.fs.pipe(f"{data.prefix}/bad.parquet", b"PAR1" + b"\x00garbage\xff" * 400)
    return data


def test_a_corrupt_file_is_quarantined_until_it_is_replaced(s3: Any, daemon: Any, data_c: Dataset) -> None:
    d = daemon(data_c.url, samplers=1, extra=FAST)
    good = data_c.rows
    t0 = time.monotonic()

    def bad_entry() -> dict[str, Any] | None:
        s = status(d)
        found = [q for q in s["quarantined"] if q["path"].endswith("bad.parquet")]
        return found[0] if found and s["samples"] >= good else None

    entry = wait_for(bad_entry, 60, "bad.parquet quarantined and the good files cached")
    assert entry["reason"].strip(), entry
    listed = quarantine_api(d)
    assert [p for p in listed if p.endswith("bad.parquet")], listed
    quarantined_s = time.monotonic() - t0

    data_c.put("bad.parquet", 90000, 2)  # valid Parquet now: a new size and ETag
    t1 = time.monotonic()
    s = wait_for(lambda: (lambda s: s if s["samples"] >= data_c.rows else None)(status(d)), 60,
                 "bad.parquet out of quarantine and its rows cached")
    figures("c", quarantined_after_s=f"{quarantined_s:.1f}", reason=entry["reason"][:80],
            cached_after_replace_s=f"{time.monotonic() - t1:.1f}", samples=s["samples"], rows=data_c.rows)
    assert not [q for q in s["quarantined"] if q["path"].endswith("bad.parquet")], s["quarantined"]
    assert not [p for p in quarantine_api(d) if p.endswith("bad.parquet")]
    summary = check_cache(d.cache_dir, expect_ids=data_c.expect_ids)
    assert summary.rows == data_c.rows
    assert call(d, "/healthz")[0] == 200


# ----------------------------------------------------------------------------------------------- d
@pytest.fixture(scope="module")
def data_d(s3: Any, bucket: str) -> Dataset:
    return Dataset(s3, bucket, "faults-d", files=2, groups=6)


def test_a_file_replaced_while_it_is_sampled_is_read_anew_not_quarantined(s3: Any, daemon: Any,
                                                                          data_d: Dataset) -> None:
    """No listing for 300 s and ingest held to about 100 KB/s, so that units of part-00001 are still to sample
    when it is replaced by a longer version (8 row groups, the same ids, zstd: every chunk at another offset)."""
    d = daemon(data_d.url, samplers=1, extra=["--max-bytes", BUDGET, "--discover-interval", "300",
                                              "--retry-seconds", "1", "--max-ingest-rate", "100KB"])
    wait_for(lambda: 0 < status(d)["samples"] <= 3 * ROWS_PER_GROUP, 60, "the first shards resident")
    data_d.put("part-00001.parquet", 10000, 8, compression="zstd")
    t0, seen = time.monotonic(), set()

    def all_rows() -> dict[str, Any] | None:
        s = status(d)
        seen.update(q["path"] for q in s["quarantined"])
        return s if s["samples"] >= data_d.rows else None

    s = wait_for(all_rows, 90, f"all {data_d.rows} rows resident after the replacement")
    figures("d", cached_after_replace_s=f"{time.monotonic() - t0:.1f}", samples=s["samples"], rows=data_d.rows,
            unit_failures=s["remote_errors"])
    assert not seen, f"quarantined on the way: {seen}"
    assert s["samples"] == data_d.rows, s["samples"]  # the new row groups, and no row twice
    text = Path(d.log_path).read_text()
    assert "the file changed since it was listed" in text, d.log_tail(4000)
    assert "part-00001.parquet changed" in text, d.log_tail(4000)
    summary = check_cache(d.cache_dir, expect_ids=data_d.expect_ids)
    assert summary.rows == data_d.rows
