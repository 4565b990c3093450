"""Elastic resume (invariant 5, issue 25): torchrun 2 ranks x 2 DataLoader workers, SIGKILLed mid-epoch after
a checkpoint of rank 0's ``loader.state_dict()``, resumed on 1 rank x 3 workers, on 3 ranks x 1 worker and
with another batch size (tests/support/scripts/elastic_train.py): the samples yielded before the checkpoint
(every rank's first ``CHECKPOINT`` batches: the ranks step in lockstep) and those yielded after the resume are
the epoch's manifest, once each (plus, with ``partial="pad"``, the documented repeats of the order's first
samples that even out the ranks: fewer than the ranks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import client_common as cc  # noqa: E402
import pytest
from paths import SCRIPTS

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "elastic_train.py"
SEED, EPOCH, B, CHECKPOINT = 13, 2, 16, 9
BASE = {"seed": SEED, "epoch": EPOCH, "batch_size": B, "workers": 2}
LAUNCH_TIMEOUT = 150


@pytest.fixture(scope="module")
def url(s3: Any, bucket: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    odd = cc.upload(s3, bucket)
    with cc.cached_daemon(s3, odd, tmp_path_factory.mktemp("elastic-daemon")) as d:
        yield d.url


def launch(url: str, out: Path, ranks: int, cfg: dict[str, Any], state: Path | None = None
           ) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
           "--master-addr", "127.0.0.1", "--master-port", str(cc.free_port()), str(SCRIPT), url, str(out),
           json.dumps(cfg)] + ([str(state)] if state else [])
    log = open(out / f"log-{cfg['run']}.txt", "wb")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=cc.child_env({"TMPDIR": str(out)}))
    finally:
        log.close()


def lines(path: Path) -> list[list[int]]:
    raw = path.read_bytes() if path.exists() else b""
    return [json.loads(line) for line in raw.split(b"\n")[:-1]]  # a torn last line has no newline yet


@pytest.fixture(scope="module")
def killed(url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """The 2 x 2 run, killed a few steps after rank 0's checkpoint: (its state, the ids read before it)."""
    out = tmp_path_factory.mktemp("elastic-2x2")
    proc = launch(url, out, 2, {**BASE, "run": "first", "checkpoint": CHECKPOINT, "sleep": 0.05})
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        while not (out / "state-first.json").exists() or len(lines(out / "ids-first-rank1.jsonl")) < CHECKPOINT + 3:
            assert proc.poll() is None, (out / "log-first.txt").read_text()[-4000:]
            assert time.monotonic() < deadline, "the 2 x 2 run did not reach its checkpoint"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun, its ranks and their DataLoader workers
        proc.wait(30)
    assert not list(out.glob("done-*")), "the 2 x 2 run finished the epoch before it was killed"
    state = json.loads((out / "state-first.json").read_text())
    assert state["epoch"] == EPOCH and state["position"] == CHECKPOINT * 2 * B and state["batches"] == CHECKPOINT
    before = []
    for rank in range(2):
        got = lines(out / f"ids-first-rank{rank}.jsonl")
        assert len(got) > CHECKPOINT, "every rank read past the checkpoint before the kill (in flight too)"
        before += [i for batch in got[:CHECKPOINT] for i in batch]
    return out / "state-first.json", before


@pytest.mark.parametrize("ranks,workers,batch", [(1, 3, B), (3, 1, B), (2, 2, 24)])
def test_a_killed_2x2_run_resumes_exactly_on_another_topology(url: str, killed: tuple[Path, list[int]],
                                                              tmp_path: Path, ranks: int, workers: int,
                                                              batch: int) -> None:
    state, before = killed
    cfg = {**BASE, "run": "resumed", "workers": workers, "batch_size": batch}
    proc = launch(url, tmp_path, ranks, cfg, state)
    try:
        assert proc.wait(LAUNCH_TIMEOUT) == 0, (tmp_path / "log-resumed.txt").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    after = []
    steps = set()
    for rank in range(ranks):
        got = lines(tmp_path / f"ids-resumed-rank{rank}.jsonl")
        steps.add(len(got))
        assert json.loads((tmp_path / f"done-resumed-rank{rank}.json").read_text())["epoch"] == EPOCH
        after += [i for b in got for i in b]
    assert len(steps) == 1, f"ranks made different step counts: {steps}"
    union = Counter(before + after)
    assert set(union) == set(range(cc.TOTAL)), f"missing {sorted(set(range(cc.TOTAL)) - set(union))[:10]}"
    left = cc.TOTAL - len(before)
    pad = -(-left // ranks) * ranks - left  # partial="pad": the rest evened out over the new ranks
    repeats = sum(union.values()) - cc.TOTAL
    assert repeats == pad < ranks, f"{repeats} samples read twice, {pad} padding expected"
    assert all(union[i] <= 2 for i in union)
