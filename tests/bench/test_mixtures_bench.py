"""``python -m benchmarks.mixtures --quick`` (issue 24): sealing with 1 and 3 sources, every manifest verified, and the
in-process reads of a 1-source and a 3-source cache (real daemons), every pass verified against the Parquet truth;
the printed tables and the JSON hold every figure. No timing thresholds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

READ_ROWS = {("one", "numpy none"), ("three", "numpy none"), ("three", "numpy random"), ("three", "numpy stratified")}


@pytest.mark.e2e
def test_mixtures_quick(tmp_path: Path) -> None:
    out = tmp_path / "mixtures.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.mixtures", "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "bench-data")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0 and out.exists(), report
    result = json.loads(out.read_text())

    assert set(result["seal"]) == {"1 source", "3 sources"}, report
    for name, s in result["seal"].items():
        assert s["problems"] == [] and s["shards"] == result["shards"] > 0, (name, s)
        assert len(s["times_ms"]) == len(s["make_ms"]) == s["seals"] == result["seals"], (name, s)
        assert 0 < s["p50_ms"] <= s["p99_ms"] <= s["max_ms"], (name, s)
        assert 0 < s["make_p50_ms"] <= s["make_p99_ms"] and s["manifest_bytes"] > 0, (name, s)
    assert list(result["seal"]["3 sources"]["sources"]) == ["web", "code", "math"], report

    rows = result["read"]
    assert {(r["dataset"], r["loader"]) for r in rows} == READ_ROWS, report
    for r in rows:
        name = f"{r['dataset']} {r['loader']}"
        assert r["error"] is None and r["verified"], f"{name}: {r['error']} {r['passes']}\n{report}"
        assert len(r["passes"]) == result["passes"] + 1 and all(p["ok"] for p in r["passes"]), name
        assert r["samples"] == result["samples"] * result["epochs_per_pass"], name
        assert r["samples_per_s"] > 0 and r["mb_per_s"] > 0 and r["ratio_to_one_source"] > 0, name
    assert {g["goal"].split()[0] for g in result["goals"]} == {"seal", "random", "stratified"}, result["goals"]
    for text in ("p99 ms", "make p50", "x one", "stratified", "goal: "):
        assert text in proc.stdout, report
