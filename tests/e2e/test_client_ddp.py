"""DDP: ``torchrun --nproc-per-node 2`` (gloo, CPU) x ``DataLoader(num_workers=2)`` over a real daemon
(invariants 4, 5).

The module's daemon caches 1191 samples (odd: world size 2 never divides them). One torchrun launch runs every
configuration in turn (tests/support/scripts/ddp_worker.py); each rank writes, per epoch, every batch with the worker
that made it and its step count, and ``all_reduce``s a tensor after every step, so unequal step counts hang
the job: the launch's timeout turns a hang into a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import client_common as cc  # noqa: E402
import pytest
from paths import SCRIPTS

from samplecache import SampleCacheDataset  # noqa: E402
from samplecache.api.client import fetch_manifest  # noqa: E402
from samplecache.core import loose_run  # noqa: E402
from samplecache.format.manifest import unpack_shard_table  # noqa: E402
from samplecache.reading.ordering.deal import epoch_end, rank_batches, worker_batches  # noqa: E402

pytestmark = pytest.mark.e2e

WORLD = 2
WORKERS = 2
B = 16
SEED = 11
EPOCHS = [0, 1]
LAUNCH_TIMEOUT = 150  # a DDP hang (unequal steps) fails here instead of blocking the suite

CONFIGS = [
    {"name": "pad", "partial": "pad", "batched": False, "batch_size": B, "seed": SEED, "epochs": EPOCHS},
    {"name": "drop", "partial": "drop", "batched": False, "batch_size": B, "seed": SEED, "epochs": EPOCHS},
    {"name": "batched_pad", "partial": "pad", "batched": True, "batch_size": B, "seed": SEED, "epochs": EPOCHS},
    {"name": "batched_drop", "partial": "drop", "batched": True, "batch_size": B, "seed": SEED, "epochs": EPOCHS,
     "drop_last": True},
    {"name": "noshuffle", "partial": "pad", "batched": False, "batch_size": B, "seed": SEED, "epochs": [0],
     "shuffle": False},
]
REPEAT = [dict(CONFIGS[0], name="pad_again"), dict(CONFIGS[2], name="batched_pad_again")]


@pytest.fixture(scope="module")
def cached(s3: Any, bucket: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    ds = cc.upload(s3, bucket)
    with cc.cached_daemon(s3, ds, tmp_path_factory.mktemp("ddp-daemon")) as d:
        yield d


def torchrun(url: str, out: Path, configs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(WORLD),
           "--master-addr", "127.0.0.1", "--master-port", str(cc.free_port()),
           str(SCRIPTS / "ddp_worker.py"), url, str(out), json.dumps(configs)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env=cc.child_env({"TMPDIR": str(out)}))  # torchrun's log dir, not the system temp dir
    try:
        log, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {LAUNCH_TIMEOUT} s (a DDP hang?):\n"
                    f"{log.decode(errors='replace')[-4000:]}")
    text = log.decode(errors="replace")
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{text[-6000:]}"
    results: dict[str, list[dict[str, Any]]] = {}
    for cfg in configs:
        results[cfg["name"]] = [json.loads((out / f"{cfg['name']}-rank{r}.json").read_text()) for r in range(WORLD)]
    return results


@pytest.fixture(scope="module")
def runs(cached: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two torchrun launches: every config, then the shuffled ones again (determinism)."""
    first = torchrun(cached.url, tmp_path_factory.mktemp("ddp-run1"), CONFIGS)
    second = torchrun(cached.url, tmp_path_factory.mktemp("ddp-run2"), REPEAT)
    return {**first, **second}


def global_sequence(url: str, epoch: int, shuffle: bool = True, seed: int = SEED) -> list[int]:
    """The epoch's one global sequence: what a single reader (world 1, no workers) is handed."""
    ds = SampleCacheDataset(url, columns=["id"], seed=seed, shuffle=shuffle, prefetch_next=False)
    ds.set_epoch(epoch)
    return [int(s["id"]) for s in ds]


def dealt(url: str, epoch: int, seq: list[int], unit: int, partial: str = "pad") -> list[list[int]]:
    """What each (rank, worker) reads of the global sequence ``seq``, rank-major: batches of ``unit`` dealt in
    rank order step by step, each rank's batches round-robin over its workers (``samplecache.reading.ordering.deal``); a
    per-sample dataset (``unit`` 1: a plain DataLoader's batch size is unknown) deals runs (``loose_run``)."""
    pack = loose_run(SampleCacheDataset(url, columns=["id"]).plan(epoch)) if unit == 1 else 1
    out = []
    for r in range(WORLD):
        batches = rank_batches(0, epoch_end(len(seq), 0, WORLD, partial), r, WORLD, unit)
        for w in range(WORKERS):
            out.append([seq[g % len(seq)] for a, z in worker_batches(batches, unit, w, WORKERS, pack).tolist()
                        for g in range(a, z)])
    return out


def per_worker(rank_result: dict[str, Any], epoch: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for w, ids in rank_result["epochs"][str(epoch)]["batches"]:
        out.setdefault(w, []).extend(ids)
    return out


def rank_ids(rank_result: dict[str, Any], epoch: int) -> list[int]:
    return [i for _, ids in rank_result["epochs"][str(epoch)]["batches"] for i in ids]


def check_equal_ranks(res: list[dict[str, Any]], epoch: int) -> None:
    counts = [len(rank_ids(r, epoch)) for r in res]
    steps = [r["epochs"][str(epoch)]["steps"] for r in res]
    assert len(set(counts)) == 1, f"epoch {epoch}: ranks got different sample counts {counts}"
    assert len(set(steps)) == 1, f"epoch {epoch}: ranks made different step counts {steps}"
    assert all(r["epochs"][str(epoch)]["steps_sum"] == WORLD * steps[0] for r in res)
    for r in res:  # both workers of every rank delivered
        assert sorted(per_worker(r, epoch)) == list(range(WORKERS)), f"rank {r['rank']}: {sorted(per_worker(r, epoch))}"


@pytest.mark.parametrize("name", ["pad", "batched_pad"])
def test_pad_delivers_every_sample_once_plus_fewer_than_world_padding_repeats(cached: Any, runs: dict[str, Any],
                                                                              name: str) -> None:
    res = runs[name]
    total = cc.TOTAL
    per_rank = -(-total // WORLD)  # 596
    for epoch in EPOCHS:
        check_equal_ranks(res, epoch)
        assert [len(rank_ids(r, epoch)) for r in res] == [per_rank] * WORLD
        union = [i for r in res for i in rank_ids(r, epoch)]
        counts = Counter(union)
        assert set(counts) == set(range(total)), f"missing {sorted(set(range(total)) - set(counts))[:10]}"
        repeats = sorted(i for i, c in counts.items() if c > 1)
        assert max(counts.values()) <= 2
        n_pad = per_rank * WORLD - total
        assert 0 < n_pad < WORLD and len(repeats) == n_pad and len(union) == total + n_pad
        # the padding is documented as repeating the start of the epoch's global sequence
        glob = global_sequence(cached.url, epoch)
        assert sorted(glob) == list(range(total))
        assert repeats == sorted(glob[:n_pad]), (repeats, glob[:n_pad])
        # ranks x workers take that one sequence batch by batch (per sample in a plain DataLoader: the dataset
        # does not know its batch size)
        parts = [per_worker(r, epoch)[w] for r in res for w in range(WORKERS)]
        assert parts == dealt(cached.url, epoch, glob, B if res[0]["config"]["batched"] else 1)


@pytest.mark.parametrize("name", ["drop", "batched_drop"])
def test_drop_delivers_no_duplicates_and_equal_counts(runs: dict[str, Any], name: str) -> None:
    res = runs[name]
    total = cc.TOTAL
    for epoch in EPOCHS:
        check_equal_ranks(res, epoch)
        union = [i for r in res for i in rank_ids(r, epoch)]
        assert len(union) == len(set(union)), f"duplicates: {[i for i, c in Counter(union).items() if c > 1][:10]}"
        assert set(union) <= set(range(total))
        missing = total - len(union)
        if name == "drop":
            assert missing == total % WORLD  # only the tail that does not divide by the world size
        else:
            # batched_drop also has drop_last=True: each worker drops its last short batch
            assert total % WORLD <= missing < total % WORLD + WORLD * WORKERS * B
            sizes = {len(ids) for r in res for _, ids in r["epochs"][str(epoch)]["batches"]}
            assert sizes == {B}


@pytest.mark.parametrize("name", ["pad", "drop", "batched_pad", "batched_drop"])
def test_batch_counts_are_equal_and_batches_have_the_right_size(runs: dict[str, Any], name: str) -> None:
    res = runs[name]
    for epoch in EPOCHS:
        per_rank_sizes = []
        for r in res:
            sizes = [len(ids) for _, ids in r["epochs"][str(epoch)]["batches"]]
            assert all(1 <= s <= B for s in sizes)
            assert sum(s < B for s in sizes) <= WORKERS, f"more short batches than workers: {sizes}"
            per_rank_sizes.append(sorted(sizes))
        assert len({len(s) for s in per_rank_sizes}) == 1


def test_every_step_all_reduced_and_the_epoch_was_set(runs: dict[str, Any]) -> None:
    for name, res in runs.items():
        for r in res:
            for epoch in r["config"]["epochs"]:
                e = r["epochs"][str(epoch)]
                assert e["steps"] > 0 and e["steps_sum"] == WORLD * e["steps"], (name, r["rank"], epoch)
                assert e["current_epoch"] == epoch, (name, r["rank"], e["current_epoch"], epoch)


@pytest.mark.parametrize("name", ["pad", "batched_pad"])
def test_same_seed_and_world_size_give_the_same_order_run_after_run(runs: dict[str, Any], name: str) -> None:
    a, b = runs[name], runs[name + "_again"]
    for epoch in EPOCHS:
        for ra, rb in zip(a, b):
            assert ra["rank"] == rb["rank"]
            assert ra["epochs"][str(epoch)]["batches"] == rb["epochs"][str(epoch)]["batches"], (
                f"rank {ra['rank']} epoch {epoch} was delivered differently by a second torchrun")


@pytest.mark.parametrize("name", ["pad", "drop", "batched_pad"])
def test_epochs_are_shuffled_differently(runs: dict[str, Any], name: str) -> None:
    for r in runs[name]:
        e0, e1 = rank_ids(r, 0), rank_ids(r, 1)
        assert e0 != e1, f"rank {r['rank']} read epochs 0 and 1 in the same order"
    # across the whole job the per-rank split changes too (not the same shards on the same rank every epoch)
    assert set(rank_ids(runs[name][0], 0)) != set(rank_ids(runs[name][0], 1))


def test_shuffle_false_reads_in_manifest_order(cached: Any, runs: dict[str, Any]) -> None:
    res = runs["noshuffle"]
    manifest = fetch_manifest(cached.url, 0)
    expected = cc.manifest_order_ids(manifest)  # straight from LMDB: shard by shard, row 0 first
    assert sorted(expected) == list(range(cc.TOTAL))
    first_shard = unpack_shard_table(manifest["shards_packed"])[0]  # fetch_manifest asks for the compact form
    assert per_worker(res[0], 0)[0][0] == expected[0], (
        f"rank 0 worker 0 should start with row 0 of shard {first_shard[0]} (id {expected[0]})")
    check_equal_ranks(res, 0)
    parts = [per_worker(r, 0)[w] for r in res for w in range(WORKERS)]
    assert parts == dealt(cached.url, 0, expected, 1)
    for r in res:  # within a worker, rows come in order
        for w, ids in per_worker(r, 0).items():
            pos = [expected.index(i) for i in ids]
            assert pos == sorted(pos) or r["rank"] == WORLD - 1  # the last rank wraps around (padding)
