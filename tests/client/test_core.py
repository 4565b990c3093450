"""samplecache.core: no framework import, the split of an epoch, the resume state, and reading an epoch through
``Reader.samples`` / ``Reader.batches`` from a real daemon on a real S3 server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from typing import Any

import numpy as np
import pytest

from samplecache.core import (
    BatchOptions,
    CacheOptions,
    DaemonError,
    ForeignState,
    MissingColumn,
    Position,
    Reader,
    ResumeState,
    SplitOptions,
    StaleState,
    stream_for,
)
from samplecache.format.record import Column, Schema
from samplecache.reading.blocks.reader import split_batch
from samplecache.reading.epoch_source import EpochPlan

FRAMEWORKS = ("torch", "tensorflow", "jax", "nvidia.dali")


def test_importing_the_core_imports_no_framework() -> None:
    code = ("import sys, json, samplecache.core, samplecache.arrays\n"
            f"print(json.dumps([m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r} or m in {FRAMEWORKS!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == []


# --------------------------------------------------------------------------------------------- the split
def fake_plan(rows: list[int], epoch: int = 3) -> EpochPlan:
    """A manifest of shards with these row counts (ids 10, 11, ...); nothing is read from it."""
    schema = Schema((Column("id", "fixed", "<i8"),))
    shards = [[10 + i, n, 0, 64] for i, n in enumerate(rows)]
    manifest = {"epoch": epoch, "schema": schema.to_json(), "shards": shards, "lmdb_path": "/nonexistent",
                "map_size": 1 << 20, "bytes": 8 * sum(rows)}
    return EpochPlan(manifest, None)


def test_a_mixtures_read_chunk_is_bounded_by_its_largest_samples() -> None:
    """A chunk of a 2-source mixture holds each source's one-source share, but never more than ``CHUNK_BYTES`` of
    the source with the largest samples (the manifest's average would let 1 MiB images through 8,192 at a time)."""
    from samplecache.format.manifest import Manifest, pack_indices
    from samplecache.reading.epoch_source import CHUNK_BYTES

    schema = Schema((Column("id", "fixed", "<i8"),)).to_json()

    def plan(sizes: dict[str, int]) -> EpochPlan:  # source -> bytes per sample; 2 shards of 1,000 rows each
        names = sorted(sizes)
        shards = [[10 + i, 1000, 1000 * sizes[n], 64] for i, n in enumerate(names * 2)]
        m = Manifest(epoch=1, lmdb_path="/nonexistent", map_size=1 << 20, schema=schema, shards=shards,
                     bytes=sum(r[2] for r in shards), sources={n: {"schema": schema, "url": n} for n in names},
                     shard_sources=pack_indices(list(range(len(names))) * 2))
        return EpochPlan(m.to_json(), None)

    even = plan({"code": 1024, "web": 1024})
    assert even.read_chunk() == even.chunk == 4096 and even.read_chunk(2) == 8192
    skewed = plan({"images": 1 << 20, "text": 1024})
    assert skewed.read_chunk() == skewed.chunk and skewed.read_chunk(2) == max(skewed.chunk, CHUNK_BYTES >> 20)


def read_all(plan: EpochPlan, split: SplitOptions, world: int, workers: int) -> dict[int, list[tuple[int, int]]]:
    """rank -> the (shard id, row) pairs its workers read, in order."""
    out: dict[int, list[tuple[int, int]]] = {}
    for rank in range(world):
        got: list[tuple[int, int]] = []
        for w in range(workers):
            stream = stream_for(plan, split, Position(rank, world, rank, world, w, workers))
            for idx, rows in stream.chunks(0, chunk=7):
                got += [(int(plan.ids[i]), int(r)) for i, r in zip(idx, rows)]
            assert len(got) == sum(len(stream_for(plan, split, Position(rank, world, rank, world, v, workers)))
                                   for v in range(w + 1))
        out[rank] = got
    return out


@pytest.mark.parametrize("rows", [[50, 13, 1, 40], [7], [3, 3, 3]])
@pytest.mark.parametrize("world,workers", [(1, 1), (2, 3), (3, 2), (4, 1)])
@pytest.mark.parametrize("shuffle,buffer", [(True, 0), (True, 5), (False, 0)])
def test_uneven_split_reads_every_sample_once(rows: list[int], world: int, workers: int, shuffle: bool,
                                              buffer: int) -> None:
    plan = fake_plan(rows)
    got = read_all(plan, SplitOptions(shuffle, 1, "uneven", buffer), world, workers)
    every = [p for r in got.values() for p in r]
    assert sorted(every) == sorted((10 + i, k) for i, n in enumerate(rows) for k in range(n))
    counts = [len(v) for v in got.values()]
    assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("rows", [[50, 13, 1, 40], [7], [3, 3, 3]])
@pytest.mark.parametrize("world,workers", [(1, 2), (2, 3), (3, 2), (4, 1)])
@pytest.mark.parametrize("partial", ["pad", "drop"])
def test_pad_and_drop_give_every_rank_the_same_count(rows: list[int], world: int, workers: int, partial: str) -> None:
    plan = fake_plan(rows)
    total = sum(rows)
    got = read_all(plan, SplitOptions(True, 2, partial), world, workers)
    per = -(-total // world) if partial == "pad" else total // world
    assert [len(v) for v in got.values()] == [per] * world
    seen = Counter(p for r in got.values() for p in r)
    if partial == "pad":  # every sample, at most world - 1 of them twice
        assert len(seen) == total and sum(seen.values()) - total == per * world - total < world
    else:  # no repeats, fewer than world dropped
        assert max(seen.values()) == 1 and total - len(seen) < world


def test_the_split_depends_on_seed_and_epoch_only() -> None:
    pos = Position(1, 2, 1, 2, 0, 2)
    a = list(stream_for(fake_plan([30, 20]), SplitOptions(seed=5), pos).chunks(0))
    b = list(stream_for(fake_plan([30, 20]), SplitOptions(seed=5), pos).chunks(0))
    c = list(stream_for(fake_plan([30, 20], epoch=4), SplitOptions(seed=5), pos).chunks(0))
    assert all(np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert not all(np.array_equal(x[1], y[1]) for x, y in zip(a, c))


def test_several_hosts_need_an_agreed_count() -> None:
    plan = fake_plan([10, 10])
    with pytest.raises(RuntimeError, match="agree"):
        stream_for(plan, SplitOptions(), Position(rank=2, world=4, local_rank=0, local_world=2))
    assert len(stream_for(plan, SplitOptions(), Position(2, 4, 0, 2, agreed=12))) == 12  # padded up to the agreed


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="partial"):
        SplitOptions(partial="some")
    with pytest.raises(ValueError, match="batch_size"):
        BatchOptions(0)
    with pytest.raises(ValueError, match="worker"):
        Position(worker=2, workers=2)


# --------------------------------------------------------------------------------------------- resume state
def test_resume_state_round_trips_through_json() -> None:
    state = ResumeState("job-a", 7, 1234, seed=4, shuffle=True, samples=5000, daemon_epoch=9)
    d = json.loads(json.dumps(state.to_dict()))
    assert d == {"job": "job-a", "epoch": 7, "position": 1234, "seed": 4, "shuffle": True, "shuffle_buffer": 0,
                 "samples": 5000, "daemon_epoch": 9, "version": 2}
    assert ResumeState.from_dict(d) == state
    got = ResumeState.from_dict({"epoch": 2, "position": 5, "seed": 0, "shuffle": False, "batches": 9})
    assert (got.job, got.version, got.samples, got.to_dict()["batches"]) == (None, 2, None, 9)
    with pytest.raises(ValueError, match="position"):
        ResumeState("j", 1, -1, 0, True)
    with pytest.raises(ValueError, match="version"):
        ResumeState.from_dict({**d, "version": 99})


def test_a_state_from_before_elastic_resume_is_refused_saying_what_to_do() -> None:
    older = {"job": "j", "epoch": 2, "skip": [5, 7], "seed": 0, "shuffle": False, "version": 1}
    with pytest.raises(StaleState, match=r"older than elastic resume.*set_epoch\(2\)"):
        ResumeState.from_dict(older)
    r = Reader(CacheOptions("http://127.0.0.1:9"), SplitOptions(seed=0, shuffle=False))
    with pytest.raises(StaleState):
        r.load_state(older)
    assert r.pending is None


def test_resume_point_is_used_once_for_its_epoch_whatever_the_topology() -> None:
    r = Reader(CacheOptions("http://127.0.0.1:9"), SplitOptions(seed=3))
    r.pending = ResumeState(None, 4, 30, 3, True)
    assert r.resume_point(5, Position(workers=2)) == 0
    assert r.resume_point(4, Position(worker=1, workers=3), consume=False) == 30
    assert r.resume_point(4, Position(rank=2, world=8, local_rank=2, local_world=8), consume=False) == 30
    assert r.resume_point(4, Position()) == 30
    assert r.resume_point(4, Position()) == 0
    with pytest.raises(ValueError, match="seed"):
        r.load_state({"epoch": 1, "position": 0, "seed": 4, "shuffle": True})
    with pytest.raises(ValueError, match="shuffle_buffer"):
        r.load_state({"epoch": 1, "position": 0, "seed": 3, "shuffle": True, "shuffle_buffer": 64})


def test_a_state_of_another_job_is_refused() -> None:
    r = Reader(CacheOptions("http://127.0.0.1:9", job="mine"), SplitOptions(seed=3))
    with pytest.raises(ForeignState, match="job 'theirs'.*job 'mine'"):
        r.load_state({"job": "theirs", "epoch": 1, "position": 10, "seed": 3, "shuffle": True})
    assert r.pending is None


def test_a_state_of_another_epoch_manifest_is_refused() -> None:
    r = Reader(CacheOptions("http://127.0.0.1:9"), SplitOptions(seed=3))
    r.source._plans[4] = fake_plan([30, 20], epoch=4)  # this job's epoch 4: daemon epoch 4, 50 samples
    r.pending = ResumeState("j", 4, 30, 3, True, samples=50, daemon_epoch=4)
    assert r.resume_point(4, Position(), consume=False) == 30
    r.pending = ResumeState("j", 4, 30, 3, True, samples=80, daemon_epoch=2)
    with pytest.raises(ForeignState, match="daemon epoch 2 \\(80 samples\\).*daemon epoch 4 \\(50 samples\\)"):
        r.resume_point(4, Position())


# --------------------------------------------------------------------------------------------- end to end
@pytest.mark.e2e
def test_an_epoch_through_samples_and_batches_exactly_once(daemon: Any, typed_dataset: Any, truth: Any) -> None:
    d = daemon()
    total = typed_dataset.rows
    with Reader(CacheOptions(d.url, min_samples=total, wait=60), SplitOptions(seed=1)) as r:
        epoch = r.take_epoch()
        assert epoch == 0 and r.plan(epoch).total == total
        positions = [Position(rank=k, world=2, local_rank=k, local_world=2) for k in range(2)]
        assert [r.count(epoch, p) for p in positions] == [total // 2] * 2
        samples = [s for p in positions for s in r.samples(epoch, p)]
        truth.check_exactly_once(truth.check_samples(samples, typed_dataset.by_id), total)

        epoch = r.take_epoch()
        assert epoch == 1
        opts = BatchOptions(batch_size=64, prefetch=2)
        sizes, got = [], []
        for p in positions:
            for batch in r.batches(epoch, p, opts):
                assert isinstance(batch["id"], np.ndarray) and batch["tensor"].shape == (len(batch["id"]), 4, 3)
                assert isinstance(batch["text"], list)
                sizes.append(len(batch["id"]))
                got += list(split_batch(batch))
        ids = truth.check_samples(got, typed_dataset.by_id)
        truth.check_exactly_once(ids, total)
        assert sizes == ([64] * (900 // 64) + [900 % 64]) * 2

        # resume: the state at sample 1000 of the epoch's order (2 ranks x 64 per step), read on 3 ranks
        order = [int(s["id"]) for s in r.samples(epoch, Position())]  # one rank: the global order itself
        assert r.position_after(epoch, positions[0], 0, 7, 64) == 7 * 2 * 64
        state = r.state(epoch, 1000)
        assert (state.samples, state.daemon_epoch) == (total, r.plan(epoch).daemon_epoch)
        again = Reader(CacheOptions(d.url, min_samples=total, wait=60), SplitOptions(seed=1))
        again.load_state(json.loads(json.dumps(state.to_dict())))
        assert again.job == r.job
        e = again.take_epoch()
        three = [Position(rank=k, world=3, local_rank=k, local_world=3) for k in range(3)]
        start = again.resume_point(e, three[0], consume=False)
        rest = [int(s["id"]) for p in three for s in again.samples(e, p, start)]
        # 800 left, padded up to 3 ranks x 267: one repeat, the order's first sample
        assert start == 1000 and sorted(rest) == sorted(order[1000:] + order[:1])
        again.close()


@pytest.mark.e2e
def test_a_column_the_cache_lacks_is_named(daemon: Any, typed_dataset: Any) -> None:
    d = daemon()
    with Reader(CacheOptions(d.url, columns=["id", "nope"], wait=60)) as r:
        with pytest.raises(MissingColumn, match="nope.*the cache has") as e:
            r.schema()
        assert e.value.missing == ["nope"] and "text" in e.value.available
        with pytest.raises(MissingColumn, match="nope"):
            r.plan(r.take_epoch())
    with Reader(CacheOptions(d.url, columns=["text", "id"])) as r:
        assert [c["name"] for c in r.schema()["columns"]] == ["text", "id"]
    with pytest.raises(DaemonError):  # nothing listens there
        Reader(CacheOptions("http://127.0.0.1:9", deadline=1, retries=0)).schema()
