"""service/samplecache_service/store/writer.py on a really full disk (a tmpfs made by the test; root only).

LMDB reuses the pages a commit freed only after a later commit. So after an eviction on a full disk, the next
shard, tried again and again, would fail for ever as the same transaction; and a shard that evicts others for
its room cannot be written in the transaction that frees them. The writer must get both through."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from damage_data import Cache, stage, table

from samplecache_service.remote.columns import infer_schema
from samplecache_service.store.disk import out_of_space
from samplecache_service.store.eviction import EvictionPlan

ROWS = 120  # rows of 4 KB: shards of ~0.5 MB on an 8 MiB disk


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.fixture
def full(disk: Path, tmp_path: Path) -> Iterator[tuple[Cache, list[int], Path]]:
    """A cache that filled ``disk`` (its shard ids, oldest first) and the staged shard that no longer fit. The
    staging dir is on another filesystem: only LMDB fills the disk."""
    staging = tmp_path / "staging"
    staging.mkdir()
    cache = Cache(disk / "lmdb")
    schema = infer_schema(table(0, 1).schema)[0]
    ids: list[int] = []
    try:
        for k in range(64):
            path = stage(staging, f"s{k}", table(k, ROWS), schema, unit=k)[0]
            try:
                shard = cache.writer.ingest(path).result().shard
            except Exception as e:
                assert out_of_space(e), e
                break
            assert shard is not None
            ids.append(shard.id)
        else:
            raise AssertionError("the disk never filled")
        assert len(ids) >= 6, ids
        yield cache, ids, path
    finally:
        cache.close()


def test_after_an_eviction_on_a_full_disk_the_next_shard_is_written(full: tuple[Cache, list[int], Path]) -> None:
    """What a lower budget does (PATCH /v1/config): one eviction-only commit, then the held shard again."""
    cache, ids, held = full
    evict = tuple(ids[: len(ids) // 2])
    assert cache.writer.evict(lambda incoming: EvictionPlan(evict, 0, True)).result() == evict
    done = cache.writer.ingest(held).result()
    assert done.shard is not None and done.shard.id == ids[-1] + 1


def test_a_shard_that_evicts_others_for_its_room_is_written_on_a_full_disk(
        full: tuple[Cache, list[int], Path]) -> None:
    cache, ids, held = full
    evict = tuple(ids[:2])
    done = cache.writer.ingest(held, make_room=lambda incoming, source=None: EvictionPlan(evict, 0, True)).result()
    assert done.shard is not None and done.evicted == evict
    assert cache.writer.evicted["ingest"] == 2
    assert [cache.catalog.shard(i) for i in evict] == [None, None]
