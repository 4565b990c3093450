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
SAMPLECACHE_LOADERS = ("samplecache", "samplecache-batched", "samplecache-loader")
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
