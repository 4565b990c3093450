"""Smoke run of benchmarks/read_throughput.py --quick: every row verified, no timing thresholds.

The benchmark generates two tiny Parquet datasets, caches them with a real daemon
subprocess and reads them back with every loader; each pass checks the sample
count and two checksums against the Parquet ground truth.
"""

from __future__ import annotations

import json
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
