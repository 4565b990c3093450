"""Training through the cache learns: the demo's Gaussian-cluster task uploaded to S3, a daemon on ``s3://``, and
``samplecache_tools.demo.train`` (2 DataLoader workers, 3 epochs); its per-epoch lines are true (no new samples when
a job epoch reuses the daemon epoch before it); plus the ``samplecache demo`` command end to end: its cache fills,
then rolls, and it keeps its log and its chart.

Threshold: validation accuracy > 0.8 after the last epoch. The task's clusters overlap (a nearest-centroid
classifier that knows the true centres scores about 0.87 on the validation set), so 0.8 needs real learning
from correctly delivered (features, label) pairs, while leaving room for run-to-run noise.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import client_common as cc  # noqa: E402
import pytest

from samplecache_tools import demo  # noqa: E402
from samplecache_tools.launch import DaemonProcess  # noqa: E402

pytestmark = pytest.mark.e2e

VAL_ACC = 0.8
FILES, ROWS_PER_FILE, ROW_GROUP = 6, 2000, 500


@pytest.fixture(scope="module")
def learnable(s3: Any, bucket: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    local = tmp_path_factory.mktemp("demo-data")
    rows = demo.write_dataset(local, files=FILES, rows_per_file=ROWS_PER_FILE, row_group=ROW_GROUP)
    assert rows == FILES * ROWS_PER_FILE
    fs = s3.fs()
    prefix = f"{bucket}/demo-learnable"
    for f in sorted(local.glob("*.parquet")):
        fs.put_file(str(f), f"{prefix}/{f.name}")
    return f"s3://{prefix}"


@pytest.fixture(scope="module")
def daemon_url(s3: Any, learnable: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("training-daemon")
    d = DaemonProcess(learnable, work / "cache", extra=["--samplers", "2"], env=s3.env(), log_path=work / "daemon.log")
    try:
        d.start(timeout=60)
        yield d.url
    finally:
        d.stop()


def test_demo_train_over_s3_reaches_the_accuracy_threshold(daemon_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    history = demo.train(daemon_url, epochs=3, workers=2)
    out = capsys.readouterr().out
    assert [h.epoch for h in history] == [0, 1, 2]
    for h in history:
        assert h.trained == h.samples > 0, h  # every sample of the epoch, once
    sizes = [h.samples for h in history]
    assert sizes == sorted(sizes) and sizes[-1] <= FILES * ROWS_PER_FILE, sizes  # the sample only grows
    assert history[-1].loss < history[0].loss, [h.loss for h in history]
    assert history[-1].val_acc > VAL_ACC, f"validation accuracy {[h.val_acc for h in history]} (want > {VAL_ACC})"
    assert len(re.findall(r"^epoch \d+: .*val acc \d\.\d+", out, re.M)) == 3, out
    status = cc.get_json(daemon_url + "/v1/status")
    assert status["remote_errors"] == 0 and status["quarantined"] == []
    job, = [j for j in cc.get_json(daemon_url + "/v1/jobs") if j["samples_read"] > 0]  # the demo's job
    mapped = [e["daemon_epoch"] for e in job["epochs"]][:3]  # a daemon epoch is reused when nothing changed
    assert len(mapped) == 3 and mapped == sorted(mapped), job["epochs"]
    assert mapped == [h.daemon_epoch for h in history]
    assert [e["samples_read"] for e in job["epochs"]][:3] == sizes and job["leases"] == []


def test_an_epoch_that_reuses_the_daemon_epoch_reports_no_new_samples(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 22, defect 3: job epochs 1 and 2 reuse daemon epoch 0 (the whole dataset is cached before training,
    and nothing changes after), so they bring no new sample; the demo printed the manifest's '+2000 new' for each."""
    rows = demo.write_dataset(tmp_path / "remote", files=2, rows_per_file=1000, row_group=500)
    with DaemonProcess(f"file://{tmp_path / 'remote'}", tmp_path / "cache", extra=["--samplers", "1"],
                       log_path=tmp_path / "daemon.log") as d:
        deadline = time.monotonic() + 60
        while cc.get_json(d.url + "/v1/status")["samples"] < rows:
            assert time.monotonic() < deadline, d.log_tail()
            time.sleep(0.1)
        history = demo.train(d.url, epochs=3, workers=0)
    out = capsys.readouterr().out
    assert [h.daemon_epoch for h in history] == [0, 0, 0], history
    assert [h.samples for h in history] == [rows] * 3
    assert [h.new for h in history] == [rows, 0, 0], history
    assert [h.evicted for h in history] == [0, 0, 0] and [h.seen for h in history] == [rows] * 3
    assert history[-1].coverage == 1.0
    lines = re.findall(r"^epoch \d+: .*$", out, re.M)
    assert "(+2,000 new)" in lines[0] and all("(+0 new: daemon epoch 0 again)" in ln for ln in lines[1:]), lines


def test_an_epoch_line_says_what_came_and_went_in_words() -> None:
    line = demo.EpochLine(epoch=3, daemon_epoch=2, samples=32_000, new=7_500, evicted=1, coverage=0.5,
                          cache_samples=40_000, seen=60_000, trained=32_000, loss=0.35, train_acc=0.86, val_acc=0.863,
                          samples_per_s=20_000.0)
    assert line.text() == ("epoch 3: 32,000 samples (+7,500 new), 1 shard evicted, remote covered 50%, val acc 0.863 "
                           "(loss 0.350, 20,000 samples/s)")


def samplecache_command() -> list[str]:
    script = Path(sys.executable).with_name("samplecache")
    return [str(script)] if script.exists() else [sys.executable, "-m", "samplecache_service"]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path, removed at the end: the demo's DataLoader workers make AF_UNIX sockets under
    TMPDIR, whose paths may not pass 107 bytes (pytest's tmp_path under scripts/test.sh's TMPDIR is too deep)."""
    d = Path(tempfile.mkdtemp(prefix="d"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_samplecache_demo_command_fills_then_rolls_and_keeps_its_log_and_chart(short_tmp: Path) -> None:
    """``samplecache demo`` as scripts/demo.sh runs it (no --workdir: a temp dir, here under short_tmp): a budget of
    a third of the dataset fills, then rolls under the daemon's default settings; each epoch's line says what came
    and went; the temp dir keeps the daemon's log and the chart, named in the output, and nothing else."""
    tmp_path = short_tmp
    proc = subprocess.run([*samplecache_command(), "demo", "--epochs", "5"], capture_output=True, text=True,
                          timeout=240, env=cc.child_env({"TMPDIR": str(tmp_path)}))
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    lines = re.findall(r"^epoch (\d+): ([\d,]+) samples \(\+([\d,]+) new.*?\), (\d+) shards? evicted, "
                       r"remote covered (\d+)%, val acc (\d\.\d+)", out, re.M)
    assert [int(e) for e, *_ in lines] == [0, 1, 2, 3, 4], out
    samples, new, evicted, covered = ([int(ln[i].replace(",", "")) for ln in lines] for i in (1, 2, 3, 4))
    assert float(lines[-1][5]) > 0.7, out  # run_demo's own pass mark (it exits 1 below it)
    assert new[0] == samples[0] and sum(evicted) > 0, out  # it rolled: shards evicted to take in new ones
    assert any(0 < n < s for n, s in zip(new[1:], samples[1:])), out  # later epochs: some new, most kept
    assert covered == sorted(covered) and covered[-1] > 33, out  # more of the remote than the budget holds
    assert "daemon stopped (exit code 0)" in out, out
    root, = tmp_path.glob("samplecache-demo-*")
    log = re.search(r"daemon log: (\S+)$", out, re.M)
    chart = re.search(r"chart of the epochs: (\S+)$", out, re.M)
    assert log and chart, out
    assert Path(log[1]) == root / "daemon.log" and " ingested: " in Path(log[1]).read_text(), out
    assert Path(chart[1]) == root / "samplecache-demo.png" and Path(chart[1]).read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in root.iterdir()) == ["daemon.log", "samplecache-demo.png"]
    assert re.search(r"done\. Training saw [\d,]+ distinct samples of 120,000", out), out
