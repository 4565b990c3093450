"""Smoke run of ``python -m benchmarks.fidelity --quick``: the three training modes, a real S3 server and a real
daemon whose 25% budget fills and rolls under its default settings, with unpadded steps; the report's structure, the
cache mode's data checked against the ground truth, and the plots. No accuracy thresholds (a quick run is too short
to say anything about fidelity)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO


@pytest.mark.e2e
def test_fidelity_quick(tmp_path: Path) -> None:
    out, plots, work = tmp_path / "fidelity.json", tmp_path / "plots", tmp_path / "work"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.fidelity", "--quick", "--json", str(out),
                           "--plots", str(plots), "--workdir", str(work)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, report
    r = json.loads(out.read_text())
    cfg, n = r["config"], r["dataset"]["samples"]
    assert r["bayes_accuracy"] == pytest.approx(1 - cfg["flip"])
    # (b)'s daemon as it ships (no --lease-ttl) and steps as fast as they run: the cache rolls all the same (below)
    assert cfg["lease_ttl"] is None and cfg["step_ms"] == 0, cfg
    assert 0 < r["dataset"]["budget_bytes"] <= r["dataset"]["cached_bytes"] * cfg["budget"]
    assert set(r["modes"]) == {"a", "b", "c"}
    for m, mode in r["modes"].items():
        assert [run["seed"] for run in mode["runs"]] == r["seeds"], m
        for run in mode["runs"]:
            steps = [s for s, _ in run["history"]]
            assert steps[-1] == cfg["steps"] and steps == sorted(steps), m
            assert all(0.0 <= acc <= 1.0 for _, acc in run["history"]), m
            assert run["final"] == run["history"][-1][1] and run["best"] == max(a for _, a in run["history"]), m
            assert run["wait_s"] > 0 and run["compute_s"] > 0, m
        s = mode["summary"]
        assert len(s["final"]) == len(s["best"]) == 2 and 0 < s["wait_fraction"] < 1, m
    assert set(r["claim"]) >= {"within_1pt_of_a", "better_than_c", "b_minus_a_final", "b_minus_c_final"}

    for run in r["modes"]["b"]["runs"]:
        # every sample read through the cache is a sample of the dataset, with its values (ids and x, y checked
        # batch by batch against the ground truth), and no epoch repeats one
        assert run["bad_samples"] == 0 and run["duplicate_samples"] == 0, run["epochs"]
        epochs = run["epochs"]
        assert len(epochs) >= 2 and all(e["samples"] == e["unique"] > 0 for e in epochs)
        assert sum(e["samples"] for e in epochs) >= cfg["steps"]  # one batch per step (the last may be short)
        assert all(e["samples"] <= n * cfg["budget"] for e in epochs)  # an epoch never names more than the budget
        seen = [e["seen_fraction"] for e in epochs]
        assert seen == sorted(seen) and 0 < seen[-1] <= 1
        # the cache rolled: it evicted shards to take new ones, and trained on more than one budget's worth
        assert run["evictions"] > 0
        assert run["seen_fraction"] > cfg["budget"], seen
        assert run["cache_bytes"] <= run["max_bytes"] == r["dataset"]["budget_bytes"]
        assert run["daemon_coverage"]["rows"] == n

    assert sorted(p.name for p in plots.iterdir()) == ["fidelity-accuracy.png", "fidelity-cache.png"]
    for p in plots.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
