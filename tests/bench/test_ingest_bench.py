"""benchmarks/ingest/main.py: its process CPU accounting, its scaling verdict, and a --quick run end to end (a real S3
server, the real daemon at 1 and 2 samplers and on half the files, the epoch read back from LMDB); the JSON holds
CPU per MB both ways with the ratio to the raw read, the read amplification and the scaling rows. No timing
thresholds."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import REPO

from benchmarks.ingest.cpu import Snapshot, spent, tree_cpu_s
from benchmarks.ingest.rolling import budget_for, page_cache_tax, rolling_run
from benchmarks.ingest.scaling import verdict


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_tree_cpu_counts_children_live_and_reaped() -> None:
    """A child's CPU time is in its parent's tree while it runs and after it was reaped (cutime), once."""
    ctx = mp.get_context("spawn")
    before = tree_cpu_s(os.getpid())
    child = ctx.Process(target=_burn, args=(0.6,))
    child.start()
    child.join()
    assert child.exitcode == 0
    after = tree_cpu_s(os.getpid())
    burnt = after["descendants"] - before["descendants"]
    assert 0.5 <= burnt < 0.6 + 1.5, (before, after)  # its 0.6 s, plus its interpreter's start-up, not twice
    assert after["total"] == pytest.approx(after["own"] + after["descendants"])


def test_spent_splits_daemon_main_and_samplers() -> None:
    a = Snapshot(machine=10.0, server=1.0, daemon={"own": 2.0, "descendants": 3.0, "total": 5.0},
                 threads={1: 1.0, 2: 0.5})
    b = Snapshot(machine=14.0, server=1.5, daemon={"own": 2.5, "descendants": 5.0, "total": 7.5},
                 threads={1: 1.1, 2: 0.9, 3: 0.2})
    got = spent(a, b)
    assert got["machine"] == 4.0 and got["server"] == 0.5
    assert got["daemon_main"] == 0.5 and got["samplers"] == 2.0 and got["daemon_tree"] == 2.5
    assert got["busiest_thread"] == pytest.approx(0.4)


def _row(n: int, mb: float, raw: float, cores: float = 1.0, daemon: float = 0.2, thread: float = 0.1,
         occupied: float = 0.95) -> dict[str, float]:
    return {"samplers": n, "mb_per_s": mb, "raw_mb_per_s": raw, "x_raw": mb / raw, "cores_busy": cores,
            "server_cores": 0.3, "samplers_cores": 0.5, "daemon_main_cores": daemon, "busiest_thread_cores": thread,
            "sampler_occupancy": occupied}


def test_scaling_verdict_names_the_limit() -> None:
    assert verdict([_row(1, 100, 200), _row(2, 190, 390)], cores=16).startswith("scales through 2")
    assert verdict([_row(1, 100, 200), _row(2, 149.6, 390)], cores=16).startswith("scales through 2")  # "1.50x"
    assert "cores saturated" in verdict([_row(1, 100, 200), _row(2, 110, 390, cores=1.7)], cores=2)
    assert "daemon-bound (writer)" in verdict([_row(1, 100, 200), _row(2, 110, 390, daemon=0.95)], cores=16)
    assert "server-bound" in verdict([_row(1, 100, 110), _row(2, 110, 120)], cores=16)
    # the raw read stops too, but the ingest is far below it: not the server; samplers waiting for units
    assert "daemon-bound (scheduling)" in verdict([_row(1, 100, 200), _row(2, 110, 210, occupied=0.7)], cores=16)
    assert "not determined" in verdict([_row(1, 100, 200), _row(2, 110, 210)], cores=16)


def test_missing_s3fs_is_named_with_its_install_command(tmp_path: Path) -> None:
    """Without s3fs (hidden by a package that fails to import) nothing can run: the run says which and how to
    install it, writes its JSON and does not fail."""
    stub = tmp_path / "stub" / "s3fs"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    out = tmp_path / "ingest.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stub.parent), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.ingest", "--quick", "--json", str(out), "--workdir",
                           str(tmp_path / "bench-data")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    result = json.loads(out.read_text())
    assert "s3fs" in result["missing"]["s3"] and "pip install" in result["missing"]["s3"], report
    assert result["datasets"] == {} and not result["verified"], report
    assert "missing: s3: s3fs: not installed" in proc.stdout and "nothing measured" in proc.stdout, report


@pytest.mark.e2e
def test_ingest_quick(tmp_path: Path) -> None:
    out = tmp_path / "ingest.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.ingest", "--quick", "--scaling", "1,2", "--oversubscribe", "--no-variants",
         "--differential", "--json", str(out), "--workdir", str(tmp_path / "bench-data")],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())
    assert result["missing"] == {} and set(result["datasets"]) == {"large", "small"}, report
    for name, r in result["datasets"].items():
        ing = r["ingest"]
        assert r["verified"] and ing["verified"], f"{name}: {ing['check']}\n{report}"
        assert ing["check"]["samples"] == r["truth"]["samples"] == ing["status"]["samples"], report
        assert ing["remote_errors"] == 0, report
        for way in ("processes", "machine"):
            c = r["cpu"][way]
            assert c["raw_ms_per_mb"] > 0 and c["ingest_ms_per_mb"] > 0, report
            assert c["ratio"] == pytest.approx(c["ingest_ms_per_mb"] / c["raw_ms_per_mb"]), report
            assert c["target_ok"] == (c["ratio"] <= 1.5), report
        p = r["cpu"]["processes"]
        assert p["raw_server"] > 0 and p["raw_readers"] > 0 and p["ingest_samplers"] >= 0, report
        start = r["cpu"]["startup_cpu_s"]
        assert (start["per_sampler"] > 0
                and 0 <= start["after_healthz"] <= start["spawned"] * start["per_sampler"]), report
        assert r["cpu"]["incl_start"]["processes_ms_per_mb"] >= p["ingest_ms_per_mb"], report
        m = r["cpu"]["marginal"]  # the first half of the files ingested again: verified, fewer bytes
        assert "error" not in m and 0 < m["part_mb"] < r["ingest"]["mb"], f"{m}\n{report}"
        assert m["processes_ratio"] == pytest.approx(m["processes_ms_per_mb"] / p["raw_ms_per_mb"]), report
        amp = ing["amplification"]
        assert amp["needed_bytes"] == r["truth"]["row_group_bytes"] > 0, report
        assert amp["bytes_read"] >= amp["needed_bytes"], report  # nothing is cached without being fetched
        assert amp["ratio"] == pytest.approx(amp["bytes_read"] / amp["needed_bytes"]), report
        assert amp["target_ok"] == (amp["ratio"] <= 1.1), report
        rows = r["scaling"]["rows"]
        assert [w["samplers"] for w in rows] == [1, 2] and all(w["verified"] for w in rows), report
        assert all(w["mb_per_s"] > 0 and w["raw_mb_per_s"] > 0 and w["cores_busy"] > 0 for w in rows), report
        assert r["scaling"]["verdict"], report
        assert r["stages"]["units"] >= 1 and r["stages"]["total_s"] > 0, f"{r['stages']}\n{report}"
        dec = r["cpu"]["decode"]  # the readers decoding too: their own CPU is more than the fetch's alone
        assert dec["processes_ms_per_mb"] > 0 and dec["readers"] > 0 and dec["mb_per_s"] > 0, report
        assert "rolling" not in r, report  # --quick leaves the steady state out
    for text in ("CPU ms per MB", "read amplification", "scaling", "where a sampler's time goes"):
        assert text in proc.stdout, report
    assert result["verified"] and proc.returncode == 0, report


def test_rolling_budget_is_half_the_cache_but_whole_row_groups() -> None:
    """Half of what the dataset took in the cache, but 17 row groups as Parquet sizes them at least (a unit is
    read whole when it is at most 1/16 of the budget, as in the fill)."""
    assert budget_for({"row_groups": 40, "row_group_bytes": 400_000_000}, 400_000_000) == 200_000_000
    assert budget_for({"row_groups": 20, "row_group_bytes": 400_000_000}, 400_000_000) == 340_000_000
    # rows that take a quarter of their Parquet size in the cache (uint8 stored as INT32): the Parquet size rules
    assert budget_for({"row_groups": 80, "row_group_bytes": 800_000_000}, 200_000_000) == 170_000_000


def test_rolling_refuses_a_dataset_too_small_to_roll(tmp_path: Path) -> None:
    """17 row groups of 10 MB in Parquet that take 2.5 MB each in the cache: a budget of 170 MB holds all 34 (85
    MB); no daemon is started and the reason is given."""
    got = rolling_run(None, {"row_groups": 34, "row_group_bytes": 340_000_000}, None, tmp_path, 2, 5.0, 1.0,  # type: ignore[arg-type]
                      85_000_000)
    assert "too small to roll" in got["error"] and "170 MB" in got["error"], got
    assert list(tmp_path.iterdir()) == []


def test_page_cache_tax_measures_both_writes(tmp_path: Path) -> None:
    got = page_cache_tax(tmp_path / "tax", idle_s=0.0)
    assert got["mb"] > 200 and got["fresh_ms_per_mb"] > 0 and got["reused_ms_per_mb"] > 0, got
    assert got["tax_ms_per_mb"] == pytest.approx(max(0.0, got["fresh_ms_per_mb"] - got["reused_ms_per_mb"])), got
    assert list((tmp_path / "tax").iterdir()) == []  # its file is gone


@pytest.mark.e2e
def test_ingest_steady_state(tmp_path: Path) -> None:
    """The steady state on a quick LARGE dataset of 40 row groups of 4 MB: a full cache evicting as it ingests,
    its CPU per MB against the raw read and the fetch + decode, the LMDB file's size over the window, the tax."""
    out = tmp_path / "ingest.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.ingest", "--quick", "--datasets", "large", "--large-mb", "168",
         "--rolling", "2", "--scaling", "none", "--no-variants", "--json", str(out), "--workdir",
         str(tmp_path / "bench-data")], cwd=REPO, capture_output=True, text=True, timeout=300)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0 and out.exists(), report
    result = json.loads(out.read_text())
    r = result["datasets"]["large"]
    assert r["truth"]["row_groups"] >= 20 and r["verified"], report
    w = r["rolling"]
    assert "error" not in w, f"{w}\n{report}"
    assert w["budget"] < r["ingest"]["status"]["bytes"] and w["evicted_shards"] > 0 and w["mb"] > 0, report
    assert w["seconds"] >= 2 and w["mb_per_s"] == pytest.approx(w["mb"] / w["seconds"]), report
    assert w["ratio"] == pytest.approx(w["proc_cpu_ms_per_mb"] / r["cpu"]["processes"]["raw_ms_per_mb"]), report
    assert w["decode_ratio"] == pytest.approx(
        w["proc_cpu_ms_per_mb"] / r["cpu"]["decode"]["processes_ms_per_mb"]), report
    assert w["target_ok"] == (w["ratio"] <= 1.5), report
    assert w["proc_cpu_ms_per_mb"] == pytest.approx(sum(w["parts"].values()), rel=1e-6), report
    assert all(v > 0 for v in w["data_file_mb"]), report
    assert 1.0 <= w["amplification"] < 1.1, report  # whole row groups, read exactly
    tax = result["page_cache_tax"]
    assert tax["fresh_ms_per_mb"] > 0 and tax["reused_ms_per_mb"] > 0, report
    for text in ("steady state: a full cache evicting", "page-cache tax of this machine", "fetch + decode"):
        assert text in proc.stdout, report
