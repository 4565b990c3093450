"""The reader's cache identity (reading/blocks/reader.py): a manifest names the id of the cache it was sealed from,
and a reader never takes its shard ids from another cache at the same path (a new cache numbers its shards from 1 again,
so they would name other rows). A manifest sealed before caches had an id reads without the check."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import damage_data as dd
import numpy as np
import pytest

from samplecache.format.manifest import Manifest
from samplecache.reading.blocks import reader
from samplecache.reading.blocks.reader import CacheReader, CacheReplaced
from samplecache.reading.epoch_source import EpochPlan
from samplecache_service.config.settings import Settings
from samplecache_service.remote.columns import infer_schema
from samplecache_service.store.cachedir import check_identity


@pytest.fixture(autouse=True)
def close_readers(tmp_path: Path) -> Iterator[None]:
    """This process's read-only handles on the test's caches go with the test."""
    yield
    for path in [p for p in reader._ENVS if p.startswith(str(tmp_path))]:
        reader._ENVS.pop(path)[1].close()


def built_cache(root: Path, shards: int = 2, stamp: bool = True) -> tuple[dd.Built, str]:
    """A cache under ``root/lmdb`` given its id as the daemon does at start (``stamp``; else one without)."""
    built = dd.build(root, shards=shards, rows=20)
    if not stamp:
        return built, ""
    cache = dd.Cache(built.lmdb_dir)
    try:
        cache_id = check_identity(cache.catalog, cache.writer, Settings(cache_dir=root))
    finally:
        cache.close()
    return built, cache_id


def other_cache(root: Path) -> tuple[dd.Built, str]:
    """A one-shard cache whose shard 1 holds other rows than ``built_cache``'s shard 1."""
    built = dd.Built(root / "lmdb", infer_schema(dd.table(0, 1).schema)[0], {}, {}, {}, {})
    (root / "staging").mkdir(parents=True)
    cache = dd.Cache(built.lmdb_dir)
    try:
        cache.writer.put_meta({"format": 3, "source": "file:///src", "schema": built.schema.to_json()}).result()
        t = dd.table(7, 20)
        path, _, rpb = dd.stage(root / "staging", "other", t, built.schema)
        shard = cache.writer.ingest(path).result().shard
        assert shard is not None and shard.id == 1
        built.rows_per_block[1], built.y[1] = rpb, t.column("y").to_numpy()
        cache_id = check_identity(cache.catalog, cache.writer, Settings(cache_dir=root))
    finally:
        cache.close()
    return built, cache_id


def read_y(r: CacheReader, built: dd.Built, shard: int) -> np.ndarray:
    rows = np.arange(20, dtype=np.int64)
    got = r.batch(np.full(20, shard, np.int64), np.full(20, built.rows_per_block[shard], np.int64), rows, [1])
    return np.asarray(got["y"])


def test_a_manifest_of_this_cache_reads_and_one_of_another_cache_is_refused(tmp_path: Path) -> None:
    built, cache_id = built_cache(tmp_path)
    path = str(built.lmdb_dir)
    assert np.array_equal(read_y(CacheReader(path, dd.MAP_SIZE, built.schema, cache_id=cache_id), built, 1),
                          built.y[1])
    other = "f" * 32
    with pytest.raises(CacheReplaced) as info:
        read_y(CacheReader(path, dd.MAP_SIZE, built.schema, cache_id=other), built, 1)
    msg = str(info.value)
    assert f"the manifest names cache {other}, this process reads cache {cache_id}" in msg, msg
    assert path in msg and "Restart the samplecache daemon" in msg and "restart the job" in msg, msg
    # a manifest sealed before caches had an id: read without the check
    assert np.array_equal(read_y(CacheReader(path, dd.MAP_SIZE, built.schema), built, 2), built.y[2])


def test_a_cache_without_an_id_is_not_the_manifests(tmp_path: Path) -> None:
    built, _ = built_cache(tmp_path, stamp=False)
    with pytest.raises(CacheReplaced, match=r"this process reads cache \(one without an id\)"):
        read_y(CacheReader(str(built.lmdb_dir), dd.MAP_SIZE, built.schema, cache_id="a" * 32), built, 1)


def test_a_cache_replaced_at_the_same_path_is_refused_though_the_old_one_is_still_open(tmp_path: Path) -> None:
    """The wrong-data case: the cache dir is removed and a second daemon makes a new cache at the same path, with
    the same shard ids holding other rows. A process that still has the old file open, and a fresh process, each
    read only the cache its manifest names."""
    old, old_id = built_cache(tmp_path / "cache")
    path = str(old.lmdb_dir)
    assert np.array_equal(read_y(CacheReader(path, dd.MAP_SIZE, old.schema, cache_id=old_id), old, 1), old.y[1])
    new, new_id = other_cache(tmp_path / "new")
    shutil.rmtree(tmp_path / "cache")
    os.rename(tmp_path / "new", tmp_path / "cache")
    assert new_id != old_id and not np.array_equal(new.y[1], old.y[1])  # shard 1 is other rows now

    # this process still maps the old (unlinked) file: the new cache's manifest is refused, not read from it
    with pytest.raises(CacheReplaced, match=f"the manifest names cache {new_id}, this process reads cache {old_id}"):
        read_y(CacheReader(path, dd.MAP_SIZE, new.schema, cache_id=new_id), new, 1)
    # a reader that opens the path anew (a restarted job) reads the new cache, and refuses the old manifest
    reader._ENVS.pop(path)[1].close()
    assert np.array_equal(read_y(CacheReader(path, dd.MAP_SIZE, new.schema, cache_id=new_id), new, 1), new.y[1])
    with pytest.raises(CacheReplaced, match=f"the manifest names cache {old_id}, this process reads cache {new_id}"):
        read_y(CacheReader(path, dd.MAP_SIZE, old.schema, cache_id=old_id), old, 1)


def test_the_manifest_carries_the_id_to_the_reader_and_old_manifests_parse(tmp_path: Path) -> None:
    built, cache_id = built_cache(tmp_path)
    fields = {"epoch": 1, "lmdb_path": str(built.lmdb_dir), "map_size": dd.MAP_SIZE, "schema": built.schema.to_json(),
              "shards": [[1, 20, 1000, built.rows_per_block[1]]]}
    raw = Manifest(**fields, cache_id=cache_id).to_json()  # type: ignore[arg-type]
    assert raw["cache_id"] == cache_id and Manifest.from_json(raw).cache_id == cache_id
    assert EpochPlan(raw, None).reader.cache_id == cache_id
    assert Manifest.from_json(fields).cache_id == ""  # sealed by an older daemon
    assert EpochPlan(fields, None).reader.cache_id == ""
    with pytest.raises(CacheReplaced):
        read_y(EpochPlan({**raw, "cache_id": "0" * 32}, None).reader, built, 1)
