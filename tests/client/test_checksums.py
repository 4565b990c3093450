"""Block checksums (record format v3): computed by the encoder, checked at ingest (writer), on read (client)
and by the LMDB meta reader's callers. The cache-file cases and ``samplecache verify`` are in test_damage.py."""

from __future__ import annotations

import struct
from pathlib import Path

import damage_data as dd
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import REPO

from samplecache.format.record import (
    FORMAT_VERSION,
    BlockView,
    DamagedBlock,
    FormatError,
    block_checksum,
    check_block,
    decode_rows,
    verify_block,
)
from samplecache.reading.blocks.reader import VERIFY_ENV, CacheReader
from samplecache_service.remote.columns import infer_schema
from samplecache_service.sampling.encoder import encode_table
from samplecache_service.store.lmdbmeta import read_meta
from samplecache_service.store.writer import DamagedShard


def _blocks() -> list[bytes]:
    """Blocks of every layout: fixed, string, list with nulls (nested layout), struct."""
    t = pa.table({
        "f": pa.array(np.arange(6, dtype=np.float32)),
        "s": pa.array(["a", "bb", None, "dddd", "", "é"]),
        "l": pa.array([[1, None], [], None, [4, 5, 6], [7], [8, 9]], pa.list_(pa.int64())),
        "st": pa.array([{"a": i, "b": str(i)} if i % 3 else None for i in range(6)]),
    })
    schema = infer_schema(t.schema)[0]
    one, _ = encode_table(t, schema, 1 << 20)
    three, _ = encode_table(t, schema, 2 * t.nbytes // 6)  # small blocks: 2 rows each
    assert len(one) == 1 and len(three) == 3
    return [bytes(b) for b in one + three]


BLOCKS = _blocks()


def test_encoder_stores_the_checksum_in_the_header() -> None:
    for blk in BLOCKS:
        assert blk[:4] == b"SCB" + bytes([FORMAT_VERSION]) and FORMAT_VERSION == 3
        assert struct.unpack_from("<Q", blk, 16)[0] == block_checksum(blk) != 0
        assert verify_block(blk) is None
        check_block(memoryview(blk), 1, 0)  # no raise


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_flipped_byte_anywhere_is_found(data: st.DataObject) -> None:
    blk = bytearray(data.draw(st.sampled_from(BLOCKS)))
    at = data.draw(st.integers(0, len(blk) - 1), label="offset")  # header, checksum, table, sections, padding
    blk[at] ^= data.draw(st.integers(1, 255), label="xor")
    assert verify_block(blk) is not None


def test_truncated_extended_and_short_blocks_are_found() -> None:
    blk = BLOCKS[0]
    assert "checksum mismatch" in (verify_block(blk[:-1]) or "")
    assert "checksum mismatch" in (verify_block(blk + b"\0") or "")
    assert "shorter than the 24-byte block header" in (verify_block(blk[:10]) or "")
    assert "bad magic" in (verify_block(b"XYZ" + blk[3:]) or "")


def test_a_v2_block_is_named_as_such() -> None:
    old = bytearray(BLOCKS[0])
    old[3] = 2
    assert verify_block(old) == f"record format v2, not v{FORMAT_VERSION}"


def test_quick_check_reads_the_header_only() -> None:
    blk = bytearray(BLOCKS[0])
    blk[-1] ^= 1
    assert verify_block(blk, full=False) is None
    assert verify_block(blk) is not None


def test_check_block_names_shard_and_block() -> None:
    blk = bytearray(BLOCKS[0])
    blk[100] ^= 0xFF
    with pytest.raises(DamagedBlock) as ei:
        check_block(blk, 42, 7)
    e = ei.value
    assert (e.shard, e.block) == (42, 7) and "checksum mismatch" in e.reason
    assert "shard 42 block 7" in str(e) and "samplecache verify" in str(e) and "--reset-cache" in str(e)
    assert isinstance(e, FormatError)


def test_checksum_does_not_change_what_decodes() -> None:
    t = pa.table({"x": pa.array([1, 2, 3], pa.int32())})
    schema = infer_schema(t.schema)[0]
    (blk,), _ = encode_table(t, schema)
    assert decode_rows(blk, schema) == [{"x": 1}, {"x": 2}, {"x": 3}]
    assert BlockView(blk, schema).nrows == 3


# --- ingest ------------------------------------------------------------------------------------


def test_ingest_refuses_a_damaged_staged_shard(tmp_path: Path) -> None:
    cache = dd.Cache(tmp_path / "lmdb")
    staging = tmp_path / "staging"
    staging.mkdir()
    try:
        schema = infer_schema(dd.table(0, 1).schema)[0]
        path, blocks, _ = dd.stage(staging, "bad", dd.table(1, 20), schema)
        raw = path.read_bytes()
        at = raw.find(bytes(blocks[2])) + 3000  # a byte in block 2's payload
        dd.flip(path, at)
        with pytest.raises(DamagedShard) as ei:
            cache.writer.ingest(path).result()
        e = ei.value
        assert (e.path, e.block) == (path, 2) and "checksum mismatch" in e.reason
        assert "bad.shard" in str(e) and "block 2" in str(e)
        assert path.exists()  # left for the caller to set aside
        assert cache.catalog.shards() == [] and cache.catalog.resident_bytes == 0
        with cache.env.begin() as txn:
            assert txn.stat(cache.dbs[b"records"])["entries"] == 0  # nothing of it in LMDB
        good, _, _ = dd.stage(staging, "good", dd.table(2, 20), schema)
        assert cache.writer.ingest(good).result().shard is not None  # the writer goes on
    finally:
        cache.close()


# --- the LMDB meta pages --------------------------------------------------------------------------


def test_read_meta_agrees_with_lmdb(tmp_path: Path) -> None:
    dd.build(tmp_path, shards=2)
    meta = read_meta(tmp_path / "lmdb" / "data.mdb")
    cache = dd.Cache(tmp_path / "lmdb")
    try:
        info = cache.env.info()
        assert meta.page_size == cache.env.stat()["psize"]
        assert (meta.last_page, meta.txnid) == (info["last_pgno"], info["last_txnid"])
        assert meta.map_size == info["map_size"]
        assert (tmp_path / "lmdb" / "data.mdb").stat().st_size >= meta.min_file_size
    finally:
        cache.close()


# --- on read ---------------------------------------------------------------------------------------


def _damaged(tmp_path: Path) -> tuple[dd.Built, int, int]:
    built = dd.build(tmp_path, shards=3, rows=20)
    shard, block = 2, 3
    dd.flip(built.lmdb_dir / "data.mdb", dd.block_offset(built, shard, block) + 7000)
    return built, shard, block


def _read(reader: CacheReader, built: dd.Built, shard: int, rows: np.ndarray) -> dict[str, np.ndarray]:
    n = len(rows)
    got = reader.batch(np.full(n, shard, np.int64), np.full(n, built.rows_per_block[shard], np.int64),
                       rows.astype(np.int64), [0, 1])
    return got


def test_read_verification_serves_no_wrong_value(tmp_path: Path) -> None:
    built, bad_shard, bad_block = _damaged(tmp_path)
    reader = CacheReader(str(built.lmdb_dir), dd.MAP_SIZE, built.schema, verify=True)
    wrong = served = refused = 0
    for sid, rpb in built.rows_per_block.items():
        for row in range(20):
            try:
                got = _read(reader, built, sid, np.array([row]))
            except DamagedBlock as e:
                assert (e.shard, e.block) == (bad_shard, bad_block) == (sid, row // rpb)
                refused += 1
                continue
            served += 1
            wrong += int(not np.array_equal(got["x"][0], built.x[sid][row])) + int(got["y"][0] != built.y[sid][row])
    assert wrong == 0 and refused == built.rows_per_block[bad_shard] and served == 60 - refused


def test_without_verification_the_flipped_byte_is_served(tmp_path: Path) -> None:
    """Why verification on read exists: the same read without it returns a wrong value, silently."""
    built, shard, block = _damaged(tmp_path)
    rpb = built.rows_per_block[shard]
    reader = CacheReader(str(built.lmdb_dir), dd.MAP_SIZE, built.schema)
    assert reader.verify is False
    rows = np.arange(block * rpb, (block + 1) * rpb)
    got = _read(reader, built, shard, rows)
    assert not np.array_equal(got["x"], built.x[shard][rows])


def test_verify_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built, shard, block = _damaged(tmp_path)
    monkeypatch.setenv(VERIFY_ENV, "1")
    reader = CacheReader(str(built.lmdb_dir), dd.MAP_SIZE, built.schema)
    assert reader.verify is True
    with pytest.raises(DamagedBlock, match=f"shard {shard} block {block}"):
        _read(reader, built, shard, np.array([block * built.rows_per_block[shard]]))
    monkeypatch.setenv(VERIFY_ENV, "0")
    assert CacheReader(str(built.lmdb_dir), dd.MAP_SIZE, built.schema).verify is False


def test_a_block_is_hashed_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = dd.build(tmp_path, shards=1, rows=20)
    calls: list[tuple[int, int]] = []
    import samplecache.reading.blocks.reader as reader_mod
    real = reader_mod.check_block
    monkeypatch.setattr(reader_mod, "check_block", lambda buf, s, b: (calls.append((s, b)), real(buf, s, b)))
    for _ in range(2):  # two readers (two epochs) of one cache in one process
        reader = CacheReader(str(built.lmdb_dir), dd.MAP_SIZE, built.schema, verify=True)
        for _ in range(3):
            _read(reader, built, 1, np.arange(20))
    assert sorted(calls) == [(1, b) for b in range(len(built.blocks))]


def test_checksums_benchmark_quick(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys
    out = tmp_path / "out.json"
    repo = REPO  # python -m benchmarks.checksums runs from the repository root
    proc = subprocess.run([sys.executable, "-m", "benchmarks.checksums", "--quick", "--workdir", str(tmp_path / "w"),
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["dataset"], r["verify"]) for r in result["read"]] == [
        (d, m) for d in ("small", "large") for m in ("off", "first", "steady")]
    assert all(r["verified"] and r["samples_per_s"] > 0 and r["ratio_to_off"] > 0 for r in result["read"])
    assert result["ingest"]["verify_mb_per_s"] > 0 and 0 < result["ingest"]["verify_share"] < 1
    assert not (tmp_path / "w").exists()
