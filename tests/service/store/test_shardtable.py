"""The resident shards as columns (store/shardtable.py): kept in id order through adds, removals and seals, equal
to the records they mirror; and the packed shard table of a stored manifest (format/manifest.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from samplecache.format.manifest import PACKED, pack_shard_table, unpack_shard_table
from samplecache_service.store.catalog import Shard
from samplecache_service.store.shardtable import ShardTable


def shard(sid: int, source: str = "default", path: str = "a.parquet") -> Shard:
    return Shard(id=sid, key=f"k{sid}", path=path, row_group=0, unit=sid, cycle=0, rows=sid % 7 + 1,
                 bytes=100 * sid, rows_per_block=4, blocks=1, created=0.0, source=source)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 3000)), max_size=300))
def test_the_columns_are_the_records_in_id_order(ops: list[tuple[bool, int]]) -> None:
    table, live = ShardTable(), {}
    for add, sid in ops:  # ids in any order: out-of-order adds shift the columns
        if add and sid not in live:
            live[sid] = shard(sid, source=("web", "code")[sid % 2], path=f"f{sid % 5}")
            table.add(live[sid])
        elif not add:
            live.pop(sid, None)
            table.remove(sid)
    cols = table.columns()
    ids = sorted(live)
    assert cols.id.tolist() == ids and len(table) == len(ids)
    assert cols.rows.tolist() == [live[i].rows for i in ids] and cols.bytes.tolist() == [100 * i for i in ids]
    assert [cols.sources[k] for k in cols.source.tolist()] == [live[i].source for i in ids]
    assert cols.of_source("web").tolist() == [live[i].source == "web" for i in ids]
    assert cols.in_files(["f1", "nope"]).tolist() == [live[i].path == "f1" for i in ids]
    asked = np.unique(np.array([sid for _, sid in ops] + [0, 5000], np.int64))  # removed, live, never there
    assert table.resident(asked) == len(set(asked.tolist()) & set(live))


def test_a_seal_sets_last_used_for_its_shards_only() -> None:
    table = ShardTable()
    for sid in range(1, 11):
        table.add(shard(sid))
    table.remove(3)
    table.used(np.array([2, 3, 5, 99]), 7)  # 3 is gone, 99 never was: left out
    table.used(np.array([5]), 4)  # an older epoch never takes it back
    assert table.last_used() == {i: (7 if i in (2, 5) else -1) for i in range(1, 11) if i != 3}
    assert table.columns().take(np.array([0, 2])).id.tolist() == [1, 4]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2**40), st.integers(0, 2**20), st.integers(-1, 2**62),
                          st.integers(1, 70000)), max_size=50))
def test_a_packed_table_reads_back_exactly(rows: list[tuple[int, int, int, int]]) -> None:
    table = np.array(sorted(rows), np.int64).reshape(-1, 4)
    packed = pack_shard_table(table)
    assert packed.startswith(PACKED)
    assert np.array_equal(unpack_shard_table(packed), table)


def test_a_large_table_packs_small() -> None:
    n = 100_000
    sizes = np.random.default_rng(0).integers(50_000, 200_000, n)
    table = np.stack([np.arange(1, n + 1), np.full(n, 100), sizes, np.full(n, 100)], axis=1)
    packed = pack_shard_table(table)
    assert len(packed) < 0.25 * len(str(table.tolist()))  # vs the JSON list of rows: random sizes do not shrink
    assert np.array_equal(unpack_shard_table(packed), table)
