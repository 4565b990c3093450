"""Smoke runs of benchmarks/read_throughput.py --quick and benchmarks/suite.py --quick: every row
verified, no timing thresholds.

The benchmark generates two tiny Parquet datasets, caches them with a real daemon
subprocess and reads them back with every loader; each pass checks the sample
count and two checksums against the Parquet ground truth.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "read_throughput.py"

# (loader, workers) rows expected for each dataset
EXPECTED_ROWS = {("lmdb-limit", 0), ("lmdb-block", 0), ("client", 0), ("dataloader", 0), ("dataloader", 2),
                 ("batched", 0), ("batched", 2)}


@pytest.mark.e2e
def test_read_throughput_quick(tmp_path: Path) -> None:
    out = tmp_path / "tmp.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out), "--workdir", str(tmp_path / "bench-data")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())
    rows = result["rows"]

    for dataset in ("small", "large"):
        got = {(r["loader"], r["workers"]) for r in rows if r["dataset"] == dataset}
        assert got == EXPECTED_ROWS, f"{dataset}: rows {sorted(got)}\n{report}"

    for r in rows:
        name = f"{r['loader']} {r['dataset']} workers={r['workers']}"
        assert r["error"] is None, f"{name}: {r['error']}\n{report}"
        assert r["verified"], f"{name} not verified: {r['passes']}\n{report}"
        # one warm-up pass + result["passes"] timed passes, each with the count and both checksums matching
        assert len(r["passes"]) == result["passes"] + 1, name
        for p in r["passes"]:
            assert p["ok"], f"{name}: {p}"
        assert r["expected"]["samples"] == r["samples"] > 0, name
        assert len(r["times_s"]) == result["passes"], name
        assert all(t > 0 for t in r["times_s"]), name
        assert r["samples_per_s"] > 0 and r["mb_per_s"] > 0, name

    for dataset in ("small", "large"):
        manifest = result["findings"][dataset]["manifest"]
        assert manifest["samples"] == result["datasets"][dataset]["samples"]
    assert proc.returncode == 0, report


# --- benchmarks/suite.py --quick: samplecache against the peers --------------------------------------

SUITE = REPO / "benchmarks" / "suite.py"
PEER_LOADERS = ("lmdb-pickle", "parquet-arrow", "streaming", "litdata", "webdataset")
SAMPLECACHE_LOADERS = ("samplecache", "samplecache-batched", "samplecache-loader", "samplecache-loader-ps")
CORE_LOADERS = (*SAMPLECACHE_LOADERS, "lmdb-pickle", "parquet-arrow")  # need no extra
SUITE_ROWS = {("lmdb-limit", 0), ("lmdb-block", 0)} | {
    (loader, w) for loader in (*SAMPLECACHE_LOADERS, *PEER_LOADERS) for w in (0, 2)}
STREAMING_SHM = re.compile(r"^\d{6}_(locals|barrier|next_epoch|cache_usage|shard_states|shard_access_times|"
                           r"resume|epoch_shape|epoch_data)$")


def _streaming_shm() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if STREAMING_SHM.match(n)}
    except OSError:
        return set()


@pytest.mark.e2e
def test_suite_quick(tmp_path: Path) -> None:
    """Every loader row of the suite, both datasets, workers 0 and 2: present, and every pass of every
    row that could run verified (count + checksums); peers that are not installed say so."""
    out, md, workdir = tmp_path / "suite.json", tmp_path / "benchmarks.md", tmp_path / "bench-data"
    shm_before = _streaming_shm()
    proc = subprocess.run(
        [sys.executable, str(SUITE), "--quick", "--json", str(out), "--md", str(md), "--workdir", str(workdir)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())
    rows = result["rows"]

    for dataset in ("small", "large"):
        got = {(r["loader"], r["workers"]) for r in rows if r["dataset"] == dataset}
        assert got == SUITE_ROWS, f"{dataset}: rows {sorted(got)}\n{report}"

    for r in rows:
        name = f"{r['loader']} {r['dataset']} workers={r['workers']}"
        if r["missing"]:
            # an optional peer that cannot be imported is reported, not dropped
            assert r["loader"] in ("streaming", "litdata", "webdataset"), name
            assert r["status"] == "not installed" and r["missing"].startswith("not installed"), name
            assert r["passes"] == [] and r["samples_per_s"] is None, name
            continue
        assert r["error"] is None, f"{name}: {r['error']}\n{report}"
        assert r["verified"] and r["status"] == "yes", f"{name} not verified: {r['passes']}\n{report}"
        assert len(r["passes"]) == result["passes"] + 1, name  # warm-up + timed, each verified
        for p in r["passes"]:
            assert p["ok"], f"{name}: {p}"
        assert r["expected"]["samples"] == r["samples"] == result["datasets"][r["dataset"]]["samples"], name
        assert len(r["times_s"]) == result["passes"] and all(t > 0 for t in r["times_s"]), name
        assert r["samples_per_s"] > 0 and r["mb_per_s"] > 0, name
        assert r["ratio_to_limit"] is not None and r["ratio_to_limit"] > 0, name
        if r["kind"] in ("samplecache", "peer"):
            assert r["ratio_to_best_peer"] is not None and r["ratio_to_best_peer"] > 0, name
            assert r["batch_size"] == result["datasets"][r["dataset"]]["batch_size"], name
    for r in rows:
        if r["loader"] in CORE_LOADERS:
            assert not r["missing"], f"{r['loader']} needs no extra, yet: {r['missing']}"
        if r["kind"] == "peer" and r["verified"]:
            assert r["ratio_to_best_peer"] <= 1.0 + 1e-9, r

    text = md.read_text()
    assert result["date"] in text and "x best peer" in text and "| loader |" in text
    assert result["machine"]["cores"] and result["loadavg_start"] is not None
    assert _streaming_shm() <= shm_before, "MosaicML Streaming left /dev/shm entries behind"
    assert proc.returncode == 0, report


def test_suite_peers_installed() -> None:
    """The optional peers (bash benchmarks/install_peers.sh); skipped, with the reason, where missing."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import peers
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    missing = {p: why for p in ("streaming", "litdata", "webdataset") if (why := peers.missing(p))}
    if missing:
        pytest.skip(f"benchmark peers not installed (bash benchmarks/install_peers.sh): {missing}")
    assert "torchvision" not in sys.modules  # the streaming import goes around it


# --- benchmarks/daemon_scale.py --quick: manifest serving, RSS, read rate vs cache size ----------------

DAEMON_SCALE = REPO / "benchmarks" / "daemon_scale.py"


@pytest.mark.e2e
def test_daemon_scale_quick(tmp_path: Path) -> None:
    """A small cache built in-process (no remote), served by the real daemon: the manifest verified, every
    concurrent response byte-identical, figures printed; the read-rate part verified at two sizes."""
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(DAEMON_SCALE), "--quick", "--json", str(out), "--workdir", str(tmp_path / "bench-data")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())

    s = result["scale"]
    assert s["problems"] == [] and s["verified"], report
    spec = s["spec"]
    assert s["build"]["samples"] == spec["shards"] * spec["rows"], report
    assert s["manifest_bytes"] > 0 and s["seal_s"] > 0, report
    for run in (s["single_client"], s["concurrent"]):
        assert run["errors"] == 0, f"{run['error_examples']}\n{report}"
        assert run["requests"] == run["clients"] * run["requests_per_client"] > 0, report
        assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["max_ms"], report
        assert run["mb_per_s"] > 0, report
    assert s["concurrent"]["clients"] == 64, report
    for when in ("memory_idle", "memory_sealed", "memory_after_load"):
        assert s[when]["rss"] > 0 and s[when]["anon"] > 0, report
    for k in ("healthz_s", "readyz_s", "idle_s"):
        assert s["startup"][k] > 0, report
    assert s["status_idle"]["p50_ms"] > 0, report

    r = result["read"]
    assert r["problems"] == [] and r["verified"], report
    assert len(r["sizes"]) == 2, report
    for row in r["sizes"]:
        assert "skipped" not in row, report
        for kind in ("lmdb", "client"):
            assert len(row[kind]) == 2 and all(p["ok"] for p in row[kind]), f"{row[kind]}\n{report}"
            assert row[f"{kind}_mb_per_s"] > 0, report
        assert row["client_vs_smallest"] > 0, report

    for text in ("GET /v1/epochs/0", "daemon RSS", "read rate vs cache size", "verified: yes"):
        assert text in proc.stdout, report
    assert result["verified"] and proc.returncode == 0, report


# --- benchmarks/ingest.py --quick: S3 server -> LMDB against raw s3fs reads --------------------------------

INGEST = REPO / "benchmarks" / "ingest.py"


@pytest.mark.e2e
def test_ingest_quick(tmp_path: Path) -> None:
    """Both datasets uploaded to a real S3 server, read raw, ingested by the daemon (epoch 0 read back from
    LMDB: count and sum of y), and profiled stage by stage; figures printed, no timing thresholds."""
    pytest.importorskip("s3fs")
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from s3server import find_weed
        find_weed()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    finally:
        sys.path.remove(str(REPO / "tests"))
    out = tmp_path / "ingest.json"
    proc = subprocess.run(
        [sys.executable, str(INGEST), "--quick", "--json", str(out), "--workdir", str(tmp_path / "bench-data")],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())

    assert set(result["datasets"]) == {"large", "small"}, report
    for name, r in result["datasets"].items():
        ing = r["ingest"]
        assert r["verified"] and ing["verified"], f"{name}: {ing['check']}\n{report}"
        assert ing["check"]["samples"] == r["truth"]["samples"] == ing["status"]["samples"], report
        assert ing["remote_errors"] == 0, report
        assert len(r["raw"]) == 1, report  # --quick: one timed raw pass (plus the one after the daemon)
        assert all(p["mb_per_s"] > 0 and p["bytes"] == r["truth"]["row_group_bytes"] for p in r["raw"]), report
        assert r["raw_mb_per_s"] > 0 and ing["mb_per_s"] > 0 and r["ratio"] > 0, report
        assert 0 < ing["healthz_s"] < ing["done_s"], report
        stages = r["stages"]
        assert stages["units"] >= 1 and stages["total_s"] > 0, report
        assert set(stages["stages"]) == {"open_footer", "read_row_group", "encode", "stage_write", "stage_fsync",
                                         "lmdb_ingest"}, report
        assert all(v["seconds"] >= 0 for v in stages["stages"].values()), report
        assert "function calls" in r["cprofile"], report  # a cProfile table was taken (its top rows vary)
        assert r["variants"]["rows"] and all(v["mb_per_s"] > 0 for v in r["variants"]["rows"]), report
    for text in ("x raw", "where a sampler's time goes", "cProfile of run_task"):
        assert text in proc.stdout, report
    assert result["verified"] and proc.returncode == 0, report


# --- benchmarks/tf_feed.py --quick: samplecache.tf against plain tf.data over pyarrow -------------------------

TF_FEED = REPO / "benchmarks" / "tf_feed.py"
TF_LOADERS = ("samplecache.tf", "tf-pyarrow-batches", "tf-pyarrow-samples")


@pytest.mark.e2e
def test_tf_feed_quick(tmp_path: Path) -> None:
    """Every row of the TensorFlow comparison, both datasets: every pass verified (count + checksums), the
    same batch size for every row, the ratio to samplecache.tf in the JSON and the printed table."""
    out = tmp_path / "tf.json"
    proc = subprocess.run(
        [sys.executable, str(TF_FEED), "--quick", "--json", str(out), "--workdir", str(tmp_path / "bench-data")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert {(r["dataset"], r["loader"]) for r in rows} == {
        (d, name) for d in ("small", "large") for name in TF_LOADERS}, report
    for r in rows:
        name = f"{r['loader']} {r['dataset']}"
        assert r["error"] is None and r["verified"], f"{name}: {r['error']} {r['passes']}\n{report}"
        assert len(r["passes"]) == result["passes"] + 1 and all(p["ok"] for p in r["passes"]), name
        assert r["expected"]["samples"] == r["samples"] == result["datasets"][r["dataset"]]["samples"], name
        assert r["batch_size"] == result["datasets"][r["dataset"]]["batch_size"], name
        assert r["samples_per_s"] > 0 and r["ratio_samplecache_to_this"] > 0, name
        if r["loader"] == "samplecache.tf":
            assert r["ratio_samplecache_to_this"] == 1.0, name
    assert "x peer" in proc.stdout and "tf-pyarrow-samples" in proc.stdout, report
    assert proc.returncode == 0, report
