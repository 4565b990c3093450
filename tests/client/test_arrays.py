"""samplecache.arrays: numpy batches from a real daemon on a real S3 server; the README's JAX example run on CPU
(two host devices, so the sharding really splits each batch)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from paths import REPO

from samplecache.arrays import _LAUNCH, NumpyBatches, launch_run, numpy_batches, position_from
from samplecache.core import MissingColumn, Position
from samplecache.reading.blocks.reader import split_batch

pytestmark = pytest.mark.e2e
README = REPO / "README.md"


def readme_jax_example() -> str:
    text = README.read_text()
    section = text[text.index("### NumPy batches for any framework (JAX)"):]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "the README's JAX section has no python example"
    return found.group(1)


def test_the_readme_jax_example_runs_on_cpu_with_a_sharding(daemon: Any, typed_dataset: Any,
                                                            tmp_path: Path) -> None:
    d = daemon()
    checks = """
import sys
assert len(jax.devices()) == 2, jax.devices()
assert isinstance(batch["tensor"], jax.Array) and batch["tensor"].shape == (128, 4, 3), batch["tensor"].shape
assert batch["tensor"].sharding == sharding and len(batch["tensor"].addressable_shards) == 2
assert [s.data.shape for s in batch["id"].addressable_shards] == [(64,), (64,)]
assert np.isfinite(float(loss))
assert "torch" not in sys.modules
print("ok", batches.job)
"""
    script = tmp_path / "jax_example.py"
    script.write_text(f"url = {d.url!r}\n" + readme_jax_example() + checks)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "SAMPLECACHE_TOKEN": d.token}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok run-"), out.stdout


def test_two_ranks_read_every_sample_once_with_the_true_values(daemon: Any, typed_dataset: Any, truth: Any) -> None:
    d = daemon()
    total = typed_dataset.rows
    got: list[dict[str, Any]] = []
    with pytest.raises(ValueError, match="run="):  # two ranks but nothing that ties them to one run
        NumpyBatches(d.url, 100, rank=0, world=2)
    ranks = [NumpyBatches(d.url, 100, rank=k, world=2, seed=3, job="arrays", run="a1b2c3d4e5", min_samples=total)
             for k in range(2)]
    for rank in ranks:
        assert len(rank) == 9
        for batch in rank:
            assert isinstance(batch["tensor"], np.ndarray) and batch["tensor"].dtype == np.float32
            assert isinstance(batch["text"], list) and len(batch["text"]) == len(batch["id"]) == 100
            got += list(split_batch(batch))
        rank.close()
    truth.check_exactly_once(truth.check_samples(got, typed_dataset.by_id), total)


def test_state_dict_resumes_the_epoch_in_a_new_reader(daemon: Any, typed_dataset: Any) -> None:
    d = daemon()
    total = typed_dataset.rows
    with NumpyBatches(d.url, 64, columns=["id"], seed=5, shuffle_buffer=100, min_samples=total) as first:
        ids, state = [], None
        for i, batch in enumerate(first):
            ids += batch["id"].tolist()
            if i == 4:
                state = json.loads(json.dumps(first.state_dict()))
        assert sorted(ids) == list(range(total))
        assert state == {"job": first.job, "epoch": 0, "position": 320, "seed": 5, "shuffle": True,
                         "shuffle_buffer": 100, "samples": total, "daemon_epoch": 0, "version": 2}
        assert first.state_dict()["epoch"] == 0 and first.state_dict()["position"] == total
    rest = [i for b in numpy_batches(d.url, 64, columns=["id"], seed=5, shuffle_buffer=100, state=state)
            for i in b["id"].tolist()]
    assert rest == ids[320:]
    # the same state on 3 ranks with batches of 50: together they read the rest, once each
    ranks = [NumpyBatches(d.url, 50, columns=["id"], seed=5, shuffle_buffer=100, rank=k, world=3, run="a1b2c3d4e6",
                          partial="uneven") for k in range(3)]
    for rank in ranks:
        rank.load_state_dict(state)
    elastic = [i for rank in ranks for b in rank for i in b["id"].tolist()]
    assert sorted(elastic) == sorted(ids[320:])
    for rank in ranks:
        rank.close()


def test_numpy_batches_reads_epochs_from_the_one_given(daemon: Any, typed_dataset: Any) -> None:
    d = daemon()
    total = typed_dataset.rows
    sizes: list[int] = []
    ids: list[int] = []
    for batch in numpy_batches(d.url, 500, epoch=3, epochs=2, columns=["id", "vec"], drop_last=True,
                               min_samples=total):
        sizes.append(len(batch["id"]))
        ids += batch["id"].tolist()
        assert batch["vec"].shape == (500, 5)
    assert sizes == [500] * 6 and len(set(ids[:1500])) == len(set(ids[1500:])) == 1500
    assert ids[:1500] != ids[1500:]  # epochs 3 and 4 are shuffled differently


def test_a_missing_column_is_named(daemon: Any) -> None:
    d = daemon()
    with NumpyBatches(d.url, 8, columns=["id", "nope"]) as it:
        with pytest.raises(MissingColumn, match="'nope'.*the cache has"):
            next(iter(it))


def test_several_hosts_agree_through_the_callable(daemon: Any, typed_dataset: Any) -> None:
    d = daemon()
    total = typed_dataset.rows
    host = {"rank": 2, "world": 4, "local_rank": 0, "local_world": 2, "min_samples": total, "run": "00ff00ff00"}
    with NumpyBatches(d.url, 100, **host) as it:
        with pytest.raises(RuntimeError, match="agree="):  # 2 hosts, no way to agree on the epoch's length
            next(iter(it))
    asked: list[tuple[int, int]] = []
    with NumpyBatches(d.url, 100, agree=lambda e, n: asked.append((e, n)) or n + 50, **host) as it:
        ids = [i for b in it for i in b["id"].tolist()]
    assert asked == [(0, total // 2)] and len(ids) == total // 2 + 50  # padded up to the agreed count


def test_position_and_run_from_arguments_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", *_LAUNCH):
        monkeypatch.delenv(name, raising=False)
    assert launch_run(1) is None
    with pytest.raises(ValueError, match="run="):
        launch_run(2)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    run = launch_run(2)
    assert run is not None and re.fullmatch(r"[0-9a-f]{16}", run)
    monkeypatch.setenv("MASTER_PORT", "29501")
    assert launch_run(2) != run
    assert position_from() == Position()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert position_from() == Position(3, 4, 1, 2)
    assert position_from(rank=0, world=1, local_rank=0, local_world=1) == Position()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x'"):
        position_from()
