"""A small real cache for the damage tests, built without a daemon: staged shards ingested by the real Writer
into a real LMDB environment, and helpers to find and flip a stored block's bytes in ``data.mdb``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pyarrow as pa

from samplecache.format.record import Schema
from samplecache_service.remote.columns import infer_schema
from samplecache_service.sampling.encoder import encode_table
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.lmdbmap import open_env
from samplecache_service.store.staging import write_staged
from samplecache_service.store.writer import Writer

MAP_SIZE = 1 << 30
WIDTH = 1000  # int32 items of x per row: 4 KB rows, so blocks of a few rows live on LMDB overflow pages


@dataclass
class Built:
    lmdb_dir: Path
    schema: Schema
    blocks: dict[tuple[int, int], bytes]   # (shard, block) -> the stored bytes
    rows_per_block: dict[int, int]
    x: dict[int, np.ndarray]               # shard -> (rows, WIDTH) int32 values written
    y: dict[int, np.ndarray]               # shard -> (rows,) int64 values written


def table(seed: int, rows: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.integers(-2**31, 2**31 - 1, size=(rows, WIDTH), dtype=np.int32)
    y = np.arange(rows, dtype=np.int64) + 1000 * seed
    return pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), WIDTH), "y": pa.array(y)})


def stage(directory: Path, name: str, t: pa.Table, schema: Schema, block_bytes: int = 20_000,
          unit: int = 0) -> tuple[Path, list[bytearray], int]:
    blocks, rpb = encode_table(t, schema, block_bytes)
    header = {"key": name, "path": f"file:///src/{name}.parquet", "row_group": 0, "unit": unit, "cycle": 0,
              "rows": t.num_rows, "rows_per_block": rpb}
    return write_staged(directory, name, header, blocks), blocks, rpb


class Cache:
    """An open writable cache (the daemon's side): close() it before reading the file from elsewhere."""

    def __init__(self, lmdb_dir: Path) -> None:
        self.env, self.dbs = open_env(lmdb_dir, MAP_SIZE)
        self.catalog = Catalog(self.env, self.dbs)
        self.writer = Writer(self.env, self.dbs, self.catalog)

    def close(self) -> None:
        self.writer.close()
        self.env.close()


def build(root: Path, shards: int = 3, rows: int = 20) -> Built:
    """A cache of ``shards`` shards under ``root/lmdb``; the cache is closed when this returns."""
    lmdb_dir, staging = root / "lmdb", root / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    cache = Cache(lmdb_dir)
    schema = infer_schema(table(0, 1).schema)[0]
    out = Built(lmdb_dir, schema, {}, {}, {}, {})
    try:
        cache.writer.put_meta({"format": 3, "source": "file:///src", "schema": schema.to_json()}).result()
        for k in range(shards):
            t = table(k + 1, rows)
            path, blocks, rpb = stage(staging, f"s{k}", t, schema, unit=k)
            shard = cache.writer.ingest(path).result().shard
            assert shard is not None
            out.rows_per_block[shard.id] = rpb
            out.x[shard.id] = t.column("x").combine_chunks().values.to_numpy().reshape(rows, WIDTH)
            out.y[shard.id] = t.column("y").to_numpy()
            for b, blk in enumerate(blocks):
                out.blocks[(shard.id, b)] = bytes(blk)
    finally:
        cache.close()
    return out


def flip(path: Path, offset: int, xor: int = 0x5A) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([old ^ xor]))


def block_offset(built: Built, shard: int, block: int) -> int:
    """Where the stored block starts in data.mdb (blocks of these sizes are on overflow pages, contiguous)."""
    raw = (built.lmdb_dir / "data.mdb").read_bytes()
    blk = built.blocks[(shard, block)]
    at = raw.find(blk)
    assert at >= 0 and raw.find(blk, at + 1) < 0, "the block must be stored once, contiguously"
    return at


def report_json(stdout: str) -> Any:
    return json.loads(stdout)


def read_all_blocks(lmdb_dir: Path) -> int:
    """Touch every stored block (what a reader would do); the number of bytes read."""
    env = lmdb.open(str(lmdb_dir), readonly=True, max_dbs=8, subdir=True)
    n = 0
    try:
        db = env.open_db(b"records", create=False)
        with env.begin(buffers=True) as txn:
            for _, v in txn.cursor(db=db):
                n += sum(bytes(v[::512]))
    finally:
        env.close()
    return n
