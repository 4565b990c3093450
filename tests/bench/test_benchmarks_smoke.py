"""Smoke runs of the benchmarks (``python -m benchmarks.<name> --quick`` from the repository root): every
row verified, no timing thresholds (benchmarks.ingest's run is in tests/bench/test_ingest_bench.py); and a benchmark
on a machine missing a peer (simulated: a stub package that raises ImportError hides the installed one) names it
with its install command and reports the rest.

The loader benchmarks generate two tiny Parquet datasets, cache them with a real daemon subprocess and read
them back with every loader; each pass checks the sample count and two checksums against the Parquet
ground truth.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO


def bench(name: str, *args: str | Path, timeout: float = 600, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.NAME ARGS`` from the repository root (where the package is importable)."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def hide(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing each of ``modules`` fails as if it were not installed: a stub package
    of that name that raises ImportError, first on PYTHONPATH."""
    stubs = tmp_path / "hidden-modules"
    for m in modules:
        (stubs / m).mkdir(parents=True, exist_ok=True)
        (stubs / m / "__init__.py").write_text(f"raise ImportError('{m} hidden by the test: simulated missing')\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(stubs), *filter(None, [os.environ.get("PYTHONPATH")])]))

# (loader, workers) rows expected for each dataset
EXPECTED_ROWS = {("lmdb-limit", 0), ("lmdb-block", 0), ("client", 0), ("dataloader", 0), ("dataloader", 2),
                 ("batched", 0), ("batched", 2)}


@pytest.mark.e2e
def test_read_throughput_quick(tmp_path: Path) -> None:
    out = tmp_path / "tmp.json"
    proc = bench("read_throughput", "--quick", "--json", out, "--workdir", tmp_path / "bench-data")
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


# --- python -m benchmarks.suite --quick: samplecache against the peers --------------------------------------

PEER_LOADERS = ("lmdb-pickle", "parquet-arrow", "streaming", "litdata", "webdataset")
SAMPLECACHE_LOADERS = ("samplecache", "samplecache-batched", "samplecache-loader", "samplecache-loader-ps")
CORE_LOADERS = (*SAMPLECACHE_LOADERS, "lmdb-pickle", "parquet-arrow")  # need no extra
SUITE_ROWS = {("lmdb-limit", 0), ("lmdb-block", 0), ("lmdb-shuffled", 0)} | {
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
    proc = bench("suite", "--quick", "--json", out, "--md", md, "--workdir", workdir, timeout=900)
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
    proc = subprocess.run([sys.executable, "-c", "import json, sys\n"
                           "from benchmarks.harness import missing\n"
                           "gone = {p: why for p in ('streaming', 'litdata', 'webdataset') if (why := missing(p))}\n"
                           "print(json.dumps({'missing': gone, 'torchvision': 'torchvision' in sys.modules}))"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    if got["missing"]:
        pytest.skip(f"benchmark peers not installed (bash benchmarks/install_peers.sh): {got['missing']}")
    assert not got["torchvision"]  # the streaming import goes around it


@pytest.mark.e2e
def test_suite_reports_missing_peers(tmp_path: Path) -> None:
    """A machine without webdataset and MosaicML Streaming (hidden): their rows say 'not installed' with the
    install command, the report lists them, every other row still runs and is verified, exit code 0."""
    out, workdir = tmp_path / "suite.json", tmp_path / "bench-data"
    proc = bench("suite", "--quick", "--datasets", "small", "--workers", "0", "--no-md", "--json", out,
                 "--workdir", workdir, "--loaders", "lmdb-limit,samplecache-batched,parquet-arrow,webdataset,streaming",
                 env=hide(tmp_path, "webdataset", "streaming"), timeout=600)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())
    rows = {r["loader"]: r for r in result["rows"]}
    assert set(rows) == {"lmdb-limit", "samplecache-batched", "parquet-arrow", "webdataset", "streaming"}, report
    for name in ("webdataset", "streaming"):
        r = rows[name]
        assert r["status"] == "not installed" and r["missing"].startswith("not installed"), r
        assert "simulated missing" in r["missing"] or "No module named" in r["missing"], r
        assert "bash benchmarks/install_peers.sh" in r["missing"], r
        assert r["passes"] == [] and r["samples_per_s"] is None and not r["verified"], r
    for name in ("lmdb-limit", "samplecache-batched", "parquet-arrow"):
        assert rows[name]["verified"] and rows[name]["samples_per_s"] > 0, f"{name}: {rows[name]}\n{report}"
    assert {m["need"] for m in result["missing"]} == {"webdataset", "streaming"}, result["missing"]
    assert all(m["install"] == "bash benchmarks/install_peers.sh" for m in result["missing"]), result["missing"]
    assert "missing here" in proc.stdout and "webdataset==1.0.2" in proc.stdout, report
    assert proc.returncode == 0, report


# --- python -m benchmarks.daemon_scale --quick: manifest serving, RSS, read rate vs cache size ----------------


@pytest.mark.e2e
def test_daemon_scale_quick(tmp_path: Path) -> None:
    """A small cache built in-process (no remote), served by the real daemon: the manifest verified, every
    concurrent response byte-identical, figures printed; the read-rate part verified at two sizes."""
    out = tmp_path / "scale.json"
    proc = bench("daemon_scale", "--quick", "--json", out, "--workdir", tmp_path / "bench-data")
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())

    s = result["scale"]
    assert s["problems"] == [] and s["verified"], report
    spec = s["spec"]
    assert s["build"]["samples"] == spec["shards"] * spec["rows"], report
    assert s["manifest_bytes"] > 0 and s["seal_s"] > 0, report
    for run in (s["single_client"], s["concurrent"], s["concurrent_map"]):  # the last: POSTs of a job's epoch
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


# --- python -m benchmarks.tf_feed --quick: samplecache.tf against plain tf.data over pyarrow -------------------------

TF_LOADERS = ("samplecache.tf", "tf-in-memory", "tf-pyarrow-batches", "tf-pyarrow-samples")


@pytest.mark.e2e
def test_tf_feed_quick(tmp_path: Path) -> None:
    """Every row of the TensorFlow comparison, both datasets: every pass verified (count + checksums), the
    same batch size for every row, the ratio to samplecache.tf in the JSON and the printed table."""
    out = tmp_path / "tf.json"
    proc = bench("tf_feed", "--quick", "--json", out, "--workdir", tmp_path / "bench-data")
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


@pytest.mark.e2e
def test_tf_feed_reports_missing_tensorflow(tmp_path: Path) -> None:
    """tf_feed without TensorFlow (hidden): every row says 'not installed' with the pip command of the tf
    extra, nothing fails."""
    out = tmp_path / "tf.json"
    proc = bench("tf_feed", "--quick", "--datasets", "small", "--json", out, "--workdir", tmp_path / "bench-data",
                 env=hide(tmp_path, "tensorflow"))
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert out.exists(), report
    result = json.loads(out.read_text())
    assert [r["loader"] for r in result["rows"]] == list(TF_LOADERS), report
    for r in result["rows"]:
        assert r["missing"] and "pip install -e '.[tf]'" in r["missing"] and not r["verified"], r
    assert [m["need"] for m in result["missing"]] == ["tensorflow"], report
    assert "not installed" in proc.stdout and "-m pip install -e '.[tf]'" in proc.stdout, report
    assert proc.returncode == 0, report


# --- python -m benchmarks.epoch_gap / parquet_units --quick ------------------------------------------------------

@pytest.mark.e2e
def test_epoch_gap_quick(tmp_path: Path) -> None:
    """Every setting of the epoch-boundary benchmark measured (samplecache and in-memory, 0 and 2 workers),
    one gap per boundary; its temporary data under --workdir removed."""
    out, work = tmp_path / "gap.json", tmp_path / "bench-data"
    proc = bench("epoch_gap", "--quick", "--json", out, "--workdir", work)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0 and out.exists(), report
    rows = json.loads(out.read_text())
    assert {(r["loader"], r["workers"], r["persistent"]) for r in rows} == {
        (name, w, p) for name in ("samplecache", "in-memory") for w, p in ((0, False), (2, True), (2, False))}, report
    assert all(len(r["gaps_ms"]) == 1 and r["batch_ms"] > 0 for r in rows), report  # --quick: 2 epochs
    assert "worst gap / batch" in proc.stdout and "load average" in proc.stdout, report
    assert list(work.iterdir()) == [], report


@pytest.mark.e2e
def test_leases_quick(tmp_path: Path) -> None:
    """Lease takes measured at each step with the status counting them all, and every lease back after a
    restart; its temporary data under --workdir removed."""
    out, work = tmp_path / "leases.json", tmp_path / "bench-data"
    proc = bench("leases", "--quick", "--json", out, "--workdir", work)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0 and out.exists(), report
    rows = json.loads(out.read_text())
    assert [r["leases"] for r in rows] == [100, 300] and all(r["take_ms"] > 0 for r in rows), report
    assert "after a restart: 300 of 300 leases live" in proc.stdout, report
    assert list(work.iterdir()) == [], report


@pytest.mark.e2e
def test_parquet_units_quick(tmp_path: Path) -> None:
    """One large row group and many tiny ones through the real sampling task: every row staged, no error."""
    out, work = tmp_path / "units.json", tmp_path / "bench-data"
    proc = bench("parquet_units", "--quick", "--json", out, "--workdir", work)
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0 and out.exists(), report
    result = json.loads(out.read_text())
    big, tiny = result["big"], result["tiny"]
    assert big["errors"] == [] and big["rows"] == big["row_group_mib"] == 64 and big["peak_rss"] > 0, report
    assert tiny["errors"] == [] and tiny["rows"] == tiny["groups"] * 10 == 5000, report
    assert result["host"]["cpus"] and "loadavg_start" in result["host"], report
    assert list(work.iterdir()) == [], report


# --- python -m benchmarks.short_epochs --quick: each adapter's per-epoch set-up over short epochs -----------------

@pytest.mark.e2e
def test_short_epochs_quick(tmp_path: Path) -> None:
    """Every adapter reads its epochs whole (each epoch's count and checksums against the Parquet truth, else
    exit 1): set-up times and rates in the JSON and the table, the block scan beside them."""
    out = tmp_path / "short.json"
    proc = bench("short_epochs", "--quick", "--json", out, "--workdir", tmp_path / "bench-data")
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0 and out.exists(), report
    result = json.loads(out.read_text())
    assert result["rows"] == 2000 and result["epochs"] == 3, report
    got = result["results"]
    assert set(got) == {"lmdb-block", "torch-loader", "numpy", "tf", "dali"}, report
    for name in ("torch-loader", "numpy", "tf", "dali"):
        r = got[name]
        assert r["epochs"] == 3 and 0 < r["setup_ms"] <= r["setup_ms_max"], (name, r)
        assert r["samples_per_s"] > 0, (name, r)
    assert got["lmdb-block"]["samples_per_s"] > 0
    assert "set-up ms" in proc.stdout and "x block" in proc.stdout, report


# --- python -m benchmarks.feed / gpu_step --quick: the GPU host's benchmarks, on the CPU here ---------------------

@pytest.mark.e2e
def test_feed_quick(tmp_path: Path) -> None:
    """The host rows of the feed benchmark verified against the Parquet truth; on a host without CUDA the CUDA rows
    are left out (never reported as measured)."""
    out = tmp_path / "feed.json"
    proc = bench("feed", "--quick", "--json", out, "--workdir", tmp_path / "bench-data")
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0 and out.exists(), report
    result = json.loads(out.read_text())
    rows = {r["loader"]: r for r in result["rows"]}
    assert {"memcpy", "in-process", "in-process-fresh", "loader"} <= set(rows), report
    assert all(r["verified"] for r in rows.values()), report
    assert ("loader-cuda" in rows) == result["host"]["cuda"], report


@pytest.mark.e2e
def test_gpu_step_smoke_on_the_cpu(tmp_path: Path) -> None:
    """The training-step benchmark's code path on the CPU (--device cpu): each epoch verified, the GPU-wait and
    overlap columns computed; without --device cpu on a host with no GPU it refuses with a clear error."""
    import torch

    out = tmp_path / "step.json"
    proc = bench("gpu_step", "--quick", "--device", "cpu", "--workers", "0", "--ratios", "1.0", "--json", out,
                 "--workdir", tmp_path / "bench-data")
    report = f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0 and out.exists(), report
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 and rows[0]["verified"] and rows[0]["depth"] >= 1, report
    assert 0 <= rows[0]["wait"] < 1 and rows[0]["loader_ms"] > 0 and rows[0]["step_ms"] > 0, report
    if not torch.cuda.is_available():
        proc = bench("gpu_step", "--quick", "--workdir", tmp_path / "bench-data")
        assert proc.returncode == 2 and "no CUDA GPU here" in proc.stderr, proc.stderr
