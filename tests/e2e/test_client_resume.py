"""Mid-epoch resume (invariant 5): no sample repeated, none skipped.

* A training subprocess (tests/support/scripts/resume_train.py, ``SampleCacheLoader`` with 2 workers) saves
  ``loader.state_dict()`` after every batch and is SIGKILLed mid-epoch; a new process resumes from the last saved
  state (and is killed again, and a third one finishes): the batches counted by the saved states plus what the
  resumed processes read are the epoch's samples exactly once.
* In-process: ``SampleCacheDataset.state_dict()/load_state_dict()`` (no workers), ``SampleCacheLoader`` with
  workers, the batched path, ``shuffle_buffer``; a state resumed by another number of workers and another batch
  size (elastic: the state is a position of the epoch's one order); states refused loudly: of a client before
  elastic resume, of another job, of another manifest.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import client_common as cc  # noqa: E402
import pytest
from paths import SCRIPTS
from torch.utils.data import DataLoader

from samplecache import SampleCacheDataset, SampleCacheLoader  # noqa: E402
from samplecache.core import ForeignState, StaleState

pytestmark = pytest.mark.e2e

TOTAL = cc.TOTAL
SCRIPT = SCRIPTS / "resume_train.py"


@pytest.fixture(scope="module")
def url(s3: Any, bucket: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    odd = cc.upload(s3, bucket)
    with cc.cached_daemon(s3, odd, tmp_path_factory.mktemp("resume-daemon")) as d:
        yield d.url


def ids_of(item: Any) -> list[int]:
    return [int(i) for i in item["id"].reshape(-1).tolist()] if hasattr(item["id"], "reshape") else [int(item["id"])]


def check_exactly_once(ids: list[int]) -> None:
    dupes = sorted({i for i in ids if ids.count(i) > 1}) if len(ids) != len(set(ids)) else []
    missing = sorted(set(range(TOTAL)) - set(ids))
    assert not dupes and not missing and len(ids) == TOTAL, (
        f"{len(ids)} samples, duplicates {dupes[:10]}, missing {len(missing)} {missing[:10]}")


# --------------------------------------------------------------------------------------------- kill -9 and resume
def start(url: str, out: Path, cfg: dict[str, Any], state: Path | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(SCRIPT), url, str(out), json.dumps(cfg)] + ([str(state)] if state else [])
    log = open(out / f"log-{cfg['run']}.txt", "wb")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=cc.child_env(),
                                start_new_session=True)
    finally:
        log.close()


def complete_lines(path: Path) -> list[list[int]]:
    if not path.exists():
        return []
    raw = path.read_bytes()
    return [json.loads(line) for line in raw.split(b"\n")[:-1]]  # a torn last line has no newline yet


def kill_after(proc: subprocess.Popen[bytes], out: Path, run: str, batches: int, timeout: float = 90) -> None:
    """SIGKILL the training process group (the trainer and its DataLoader workers) once ``batches`` are written."""
    deadline = time.monotonic() + timeout
    ids_file = out / f"ids-{run}.jsonl"
    while len(complete_lines(ids_file)) < batches:
        if proc.poll() is not None:
            raise AssertionError(f"{run} exited {proc.returncode} before {batches} batches:\n"
                                 f"{(out / f'log-{run}.txt').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"{run} wrote fewer than {batches} batches in {timeout} s")
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    assert not (out / f"done-{run}.json").exists(), f"{run} finished the epoch before it was killed"


def consumed(out: Path, run: str) -> tuple[list[int], dict[str, Any]]:
    """Ids of the batches the last saved state counts as taken, and that state."""
    state = json.loads((out / "state.json").read_text())
    lines = complete_lines(out / f"ids-{run}.jsonl")
    k = int(state["batches"])
    assert 0 < k <= len(lines) <= k + 1, (k, len(lines))  # killed after the batch was written, before/after the save
    return [i for line in lines[:k] for i in line], state


@pytest.mark.parametrize("mode,shuffle_buffer,kills", [
    ("sample", 0, (20, 17)),
    ("batched", 0, (9,)),
    ("sample", 50, (33,)),
])
# each resumed run has another number of workers (2, then 3, then 1): the state is topology-free
def test_sigkill_mid_epoch_then_resume_in_a_new_process(url: str, tmp_path: Path, mode: str, shuffle_buffer: int,
                                                        kills: tuple[int, int]) -> None:
    epoch = 2
    base = {"seed": 21, "workers": 2, "batch_size": 16, "batched": mode == "batched",
            "shuffle_buffer": shuffle_buffer, "epoch": epoch, "sleep": 0.03}
    got: list[int] = []
    state_path = None
    saved_states = []
    for n, k in enumerate(kills):  # killed once or twice (then a run resumes a resumed epoch)
        run = f"run{n}"
        proc = start(url, tmp_path, {**base, "run": run, "workers": 2 + n}, state_path)
        kill_after(proc, tmp_path, run, k)
        ids, state = consumed(tmp_path, run)
        assert state["epoch"] == epoch and state["version"] == 2 and "skip" not in state
        got += ids
        saved_states.append(state)
        state_path = tmp_path / f"state-{n}.json"
        state_path.write_text(json.dumps(state))
    assert len(got) == len(set(got)), "the killed runs together read a sample twice"
    last = start(url, tmp_path, {**base, "run": "final", "sleep": 0.0, "workers": 1}, state_path)
    assert last.wait(120) == 0, (tmp_path / "log-final.txt").read_text()[-3000:]
    after = [i for line in complete_lines(tmp_path / "ids-final.jsonl") for i in line]
    check_exactly_once(got + after)
    done = json.loads((tmp_path / "done-final.json").read_text())
    assert done["epoch"] == epoch
    # the first run's batches are exactly what an uninterrupted run starts with (same seed -> same order)
    ds = SampleCacheDataset(url, columns=["id"], seed=21, shuffle_buffer=shuffle_buffer,
                            batch_size=16 if mode == "batched" else None)
    ds.set_epoch(epoch)
    ref = SampleCacheLoader(ds, batch_size=None if mode == "batched" else 16, num_workers=2)
    first_k = saved_states[0]["batches"]
    it = iter(ref)
    ref_ids = take(it, first_k)
    it.close()  # stop the workers (and their leases) now
    assert ref_ids == got[:len(ref_ids)]


# --------------------------------------------------------------------------------------------- in-process
def take(it: Iterator[Any], n: int) -> list[int]:
    return [i for item in itertools.islice(it, n) for i in ids_of(item)]


@pytest.mark.parametrize("batch_size,shuffle_buffer,n", [
    (None, 0, 500), (None, 100, 333), (None, 0, 1), (16, 0, 10), (16, 100, 41), (None, 7, TOTAL - 1)])
def test_dataset_state_dict_in_process(url: str, batch_size: int | None, shuffle_buffer: int, n: int) -> None:
    kw = dict(columns=["id"], seed=5, batch_size=batch_size, shuffle_buffer=shuffle_buffer)
    ds = SampleCacheDataset(url, **kw)
    ds.set_epoch(4)
    it = iter(ds)
    before = take(it, n)
    state = json.loads(json.dumps(ds.state_dict()))  # it must survive JSON
    assert state["epoch"] == 4 and state["position"] == len(before)
    rest_here = [i for item in it for i in ids_of(item)]

    fresh = SampleCacheDataset(url, **kw)
    fresh.load_state_dict(state)
    after = [i for item in fresh for i in ids_of(item)]
    assert after == rest_here, "the resumed stream differs from the rest of the original one"
    check_exactly_once(before + after)
    assert fresh.current_epoch() == 4
    nxt = take(iter(fresh), 3 if batch_size is None else 1)  # the next iteration is the next epoch, from the start
    assert fresh.current_epoch() == 5 and nxt


def test_dataset_state_at_the_end_of_the_epoch_resumes_to_nothing(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=5)
    ds.set_epoch(1)
    check_exactly_once([int(s["id"]) for s in ds])
    state = ds.state_dict()
    assert state["position"] == TOTAL
    fresh = SampleCacheDataset(url, columns=["id"], seed=5)
    fresh.load_state_dict(state)
    assert list(fresh) == []


# torch warns when a DataLoader has more workers than the host's cores (2 in CI): 3 workers are the point here (an
# odd split; a 2-worker state refused by 3 workers), so that one warning is filtered where they are asked for
MORE_WORKERS_THAN_CORES = "ignore:This DataLoader will create 3 worker processes:UserWarning"


@pytest.mark.parametrize("workers,batched,shuffle_buffer,k,then", [
    (0, False, 0, 13, (2, 16)), (2, False, 0, 25, (0, 16)), (2, True, 0, 7, (1, 24)), (2, False, 60, 38, (2, 10)),
    (2, True, 60, 1, (2, 16)),
    pytest.param(3, False, 0, 40, (2, 7), marks=pytest.mark.filterwarnings(MORE_WORKERS_THAN_CORES)),
    pytest.param(2, True, 0, 9, (3, 32), marks=pytest.mark.filterwarnings(MORE_WORKERS_THAN_CORES))])
def test_loader_state_dict_with_workers_in_process(url: str, workers: int, batched: bool, shuffle_buffer: int,
                                                   k: int, then: tuple[int, int]) -> None:
    """Saved with ``workers`` and batches of 16, resumed with ``then`` = (workers, batch size)."""
    def make(workers: int, b: int) -> SampleCacheLoader:
        ds = SampleCacheDataset(url, columns=["id"], seed=8, shuffle_buffer=shuffle_buffer,
                                batch_size=b if batched else None)
        return SampleCacheLoader(ds, batch_size=None if batched else b, num_workers=workers)

    loader = make(workers, 16)
    loader.dataset.set_epoch(3)  # type: ignore[attr-defined]
    it = iter(loader)
    before = take(it, k)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["batches"] == k and state["epoch"] == 3 and state["position"] == len(before) == 16 * k
    it.close()

    resumed = make(*then)
    resumed.load_state_dict(state)
    after = [i for batch in resumed for i in ids_of(batch)]
    check_exactly_once(before + after)
    # and after the resumed epoch the loader goes on with the next epoch, whole
    check_exactly_once([i for batch in resumed for i in ids_of(batch)])
    assert resumed.dataset.current_epoch() == 4  # type: ignore[attr-defined]


def test_dataset_state_after_set_epoch_before_the_first_sample_names_that_epoch(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=5)
    ds.set_epoch(4)
    state = ds.state_dict()
    assert (state["epoch"], state["position"]) == (4, 0)


def test_loader_state_after_set_epoch_before_the_first_batch_names_that_epoch(url: str) -> None:
    loader = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=2)
    loader.dataset.set_epoch(4)  # type: ignore[attr-defined]
    state = loader.state_dict()
    assert (state["epoch"], state["position"], state["batches"]) == (4, 0, 0)


def test_dataset_state_right_after_load_state_dict_round_trips(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=5)
    ds.load_state_dict({"epoch": 4, "position": 300, "seed": 5, "shuffle": True})
    state = ds.state_dict()
    assert (state["epoch"], state["position"]) == (4, 300)


def test_loader_state_right_after_load_state_dict_round_trips(url: str) -> None:
    loader = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=2)
    loader.load_state_dict({"epoch": 3, "position": 208, "seed": 8, "shuffle": True, "batches": 13})
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (3, 208)


def test_dataset_resume_applies_to_the_next_iteration_only(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=5)
    ds.load_state_dict({"epoch": 3, "position": 300, "seed": 5, "shuffle": True})
    assert len(list(ds)) == TOTAL - 300
    ds.set_epoch(3)  # read epoch 3 again, whole
    check_exactly_once([int(s["id"]) for s in ds])


def test_resume_survives_the_usual_set_epoch_at_the_top_of_the_epoch_loop(url: str) -> None:
    """``load_state_dict(s); for epoch in range(s['epoch'], n): ds.set_epoch(epoch); for batch in loader: ...``"""
    loader = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=2)
    loader.dataset.set_epoch(5)  # type: ignore[attr-defined]
    it = iter(loader)
    before = take(it, 11)
    state = loader.state_dict()
    it.close()
    resumed = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=2)
    resumed.load_state_dict(state)
    epochs = []
    for epoch in range(state["epoch"], state["epoch"] + 2):
        resumed.dataset.set_epoch(epoch)  # type: ignore[attr-defined]
        ids = [i for batch in resumed for i in ids_of(batch)]
        epochs.append(ids)
    check_exactly_once(before + epochs[0])
    check_exactly_once(epochs[1])


def loader_state_after(url: str, epoch: int, k: int, resume: dict[str, Any] | None = None) -> dict[str, Any]:
    loader = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=2)
    if resume is not None:
        loader.load_state_dict(resume)
        it = iter(loader)
        take(it, 2)  # the resumed epoch is cut short (a max-steps loop)...
        it.close()
    else:
        loader.dataset.set_epoch(epoch)  # type: ignore[attr-defined]
    it = iter(loader)  # ...and the next epoch starts
    take(it, k)
    state = loader.state_dict()
    it.close()
    return state


def test_loader_state_of_the_epoch_after_a_cut_short_resumed_epoch(url: str) -> None:
    after_resume = loader_state_after(url, 4, 9, resume={"epoch": 3, "position": 208, "seed": 8, "shuffle": True,
                                                         "batches": 13})
    plain = loader_state_after(url, 4, 9)
    assert after_resume["epoch"] == plain["epoch"] == 4
    assert after_resume["position"] == plain["position"] == 9 * 16, (after_resume, plain)


def test_loader_state_before_the_first_batch_resumes_the_whole_epoch(url: str) -> None:
    loader = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=2)
    state = loader.state_dict()
    assert state["batches"] == 0 and state["position"] == 0
    resumed = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=2)
    resumed.load_state_dict(state)
    check_exactly_once([i for batch in resumed for i in ids_of(batch)])


@pytest.mark.filterwarnings(MORE_WORKERS_THAN_CORES)
def test_two_worker_state_resumes_on_a_three_worker_loader(url: str) -> None:
    loader = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=2)
    loader.dataset.set_epoch(0)  # type: ignore[attr-defined]
    it = iter(loader)
    before = take(it, 5)
    state = loader.state_dict()
    it.close()
    three = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=3)
    three.load_state_dict(state)
    check_exactly_once(before + [i for batch in three for i in ids_of(batch)])


@pytest.mark.filterwarnings(MORE_WORKERS_THAN_CORES)
def test_a_position_resumes_in_a_plain_three_worker_dataloader(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=8)
    ds.set_epoch(0)
    before = [int(s["id"]) for s in itertools.islice(iter(ds), 100)]
    ds = SampleCacheDataset(url, columns=["id"], seed=8)
    ds.load_state_dict({"epoch": 0, "position": 100, "seed": 8, "shuffle": True})
    check_exactly_once(before + [i for b in DataLoader(ds, batch_size=16, num_workers=3) for i in ids_of(b)])


def test_a_state_of_another_seed_is_refused(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=8)
    with pytest.raises(ValueError, match="another order.*seed"):
        ds.load_state_dict({"epoch": 0, "position": 3, "seed": 9, "shuffle": True})
    with pytest.raises(ValueError, match="another order.*seed"):
        ds.load_state_dict({"epoch": 0, "position": 3, "seed": 8, "shuffle": False})


def test_a_state_from_before_elastic_resume_is_refused(url: str) -> None:
    loader = SampleCacheLoader(SampleCacheDataset(url, columns=["id"], seed=8), batch_size=16, num_workers=2)
    with pytest.raises(StaleState, match=r"older than elastic resume.*set_epoch\(3\)"):
        loader.load_state_dict({"epoch": 3, "skip": [112, 96], "seed": 8, "shuffle": True, "batches": 13})


def test_a_state_of_another_job_or_manifest_is_refused(url: str) -> None:
    ds = SampleCacheDataset(url, columns=["id"], seed=8)
    ds.set_epoch(2)
    take(iter(ds), 10)
    state = ds.state_dict()
    assert state["samples"] == TOTAL and state["daemon_epoch"] is not None
    mine = SampleCacheDataset(url, columns=["id"], seed=8, job="resume-another-job")
    with pytest.raises(ForeignState, match=r"job '.*'s; this reader reads job 'resume-another-job'"):
        mine.load_state_dict(state)
    forged = SampleCacheDataset(url, columns=["id"], seed=8)
    forged.load_state_dict({**state, "samples": TOTAL + 5})  # as saved from another cache's epoch
    with pytest.raises(ForeignState, match="another job or another cache"):
        next(iter(forged))
    forged.close()
