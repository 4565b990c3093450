"""service/samplecache_service/store/staging.py: staging files (tmp -> rename), reading them back, recovery after
a crash."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samplecache.format.blockenc import ColumnData, encode_block
from samplecache.format.record import Column, Schema, decode_rows
from samplecache_service.store.staging import (
    MAGIC,
    SUFFIX,
    TMP_SUFFIX,
    StagingError,
    leftovers,
    read_staged,
    write_staged,
)


def _mapped(path: Path) -> bool:
    """Whether this process has ``path`` memory-mapped (Linux)."""
    target = str(path.resolve())
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(target) or line.rstrip("\n").endswith(target + " (deleted)")
                   for line in f)


def _blocks() -> list[bytes]:
    s = Schema((Column("x", "fixed", "<i4"), Column("s", "string")))
    out = []
    for k in range(3):
        n = k + 2
        strings = [f"r{k}-{i}-é".encode() for i in range(n)]
        offs = np.concatenate([[0], np.cumsum([len(x) for x in strings])]).astype(np.int64)
        out.append(encode_block(s, [ColumnData(data=np.arange(n, dtype=np.int32) + 10 * k),
                                    ColumnData(data=np.frombuffer(b"".join(strings), np.uint8), offsets=offs)], n))
    return out


def test_write_read_round_trip(tmp_path: Path) -> None:
    blocks = _blocks()
    header = {"key": "c0-u3", "path": "s3://b/x.parquet", "row_group": 3, "rows": 9, "rows_per_block": 4}
    path = write_staged(tmp_path, "c0-u3", header, blocks)
    assert path == tmp_path / ("c0-u3" + SUFFIX)
    assert path.exists() and not (tmp_path / ("c0-u3" + TMP_SUFFIX)).exists()
    raw = path.read_bytes()
    assert raw.startswith(MAGIC)
    shard = read_staged(path)
    try:
        assert shard.path == path
        assert shard.header == dict(header, block_lengths=[len(b) for b in blocks])
        assert [bytes(b) for b in shard.blocks] == blocks
        assert all(isinstance(b, memoryview) and b.readonly for b in shard.blocks)
        s = Schema((Column("x", "fixed", "<i4"), Column("s", "string")))
        assert [r["s"] for r in decode_rows(bytes(shard.blocks[2]), s)][-1] == "r2-3-é"
    finally:
        shard.close()
    assert header == {"key": "c0-u3", "path": "s3://b/x.parquet", "row_group": 3, "rows": 9,
                      "rows_per_block": 4}  # the caller's dict is not modified


def test_zero_blocks_and_empty_blocks(tmp_path: Path) -> None:
    p = write_staged(tmp_path, "empty", {"rows": 0}, [])
    shard = read_staged(p)
    assert shard.blocks == [] and shard.header["block_lengths"] == []
    shard.close()
    p = write_staged(tmp_path, "zeros", {}, [b"", b"abc", b""])
    shard = read_staged(p)
    assert [bytes(b) for b in shard.blocks] == [b"", b"abc", b""]
    shard.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blocks=st.lists(st.binary(max_size=300), max_size=8),
       header=st.dictionaries(st.text(min_size=1, max_size=5).filter(lambda k: k != "block_lengths"),
                              st.one_of(st.integers(), st.text(max_size=10), st.booleans()), max_size=4))
def test_round_trip_property(tmp_path: Path, blocks: list[bytes], header: dict) -> None:
    p = write_staged(tmp_path, "prop", header, blocks)
    shard = read_staged(p)
    try:
        assert [bytes(b) for b in shard.blocks] == blocks
        assert {k: v for k, v in shard.header.items() if k != "block_lengths"} == header
    finally:
        shard.close()


def test_rewrite_replaces_atomically(tmp_path: Path) -> None:
    p1 = write_staged(tmp_path, "same", {"v": 1}, [b"one"])
    p2 = write_staged(tmp_path, "same", {"v": 2}, [b"two", b"2"])
    assert p1 == p2
    shard = read_staged(p2)
    assert shard.header["v"] == 2 and [bytes(b) for b in shard.blocks] == [b"two", b"2"]
    shard.close()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["same" + SUFFIX]


# --- truncated / foreign files -------------------------------------------------------------------


@pytest.fixture()
def good(tmp_path: Path) -> tuple[Path, bytes]:
    p = write_staged(tmp_path, "good", {"rows": 9}, _blocks())
    return p, p.read_bytes()


@pytest.mark.parametrize("cut", ["empty", "magic", "header", "first_block", "last_byte"])
def test_truncated_file_raises_staging_error(good: tuple[Path, bytes], cut: str) -> None:
    path, raw = good
    hlen = struct.unpack_from("<I", raw, len(MAGIC))[0]
    header_end = len(MAGIC) + 4 + hlen
    n = {"empty": 0, "magic": 5, "header": header_end - 3, "first_block": header_end + 10,
         "last_byte": len(raw) - 1}[cut]
    path.write_bytes(raw[:n])
    with pytest.raises(StagingError):
        read_staged(path)
    assert not _mapped(path)  # a failed read leaves nothing mapped


@pytest.mark.parametrize("cut", ["empty", "magic", "first_block", "last_byte"])
def test_truncation_error_names_the_file(good: tuple[Path, bytes], cut: str) -> None:
    path, raw = good
    hlen = struct.unpack_from("<I", raw, len(MAGIC))[0]
    n = {"empty": 0, "magic": 5, "first_block": len(MAGIC) + 4 + hlen + 10, "last_byte": len(raw) - 1}[cut]
    path.write_bytes(raw[:n])
    with pytest.raises(StagingError, match=path.name):
        read_staged(path)


@pytest.mark.parametrize("what", ["header", "no_block_lengths"])
def test_header_errors_name_the_file(good: tuple[Path, bytes], what: str) -> None:
    path, raw = good
    if what == "header":
        hlen = struct.unpack_from("<I", raw, len(MAGIC))[0]
        path.write_bytes(raw[:len(MAGIC) + 4 + hlen - 3])
    else:
        hdr = json.dumps({"rows": 1}).encode()
        path.write_bytes(MAGIC + struct.pack("<I", len(hdr)) + hdr)
    with pytest.raises(StagingError, match=path.name):
        read_staged(path)


@pytest.mark.parametrize("header", ["[1, 2]", '{"block_lengths": null}', '{"block_lengths": ["3"]}',
                                    '{"block_lengths": [-5, 5]}'])
def test_malformed_header_is_a_staging_error(tmp_path: Path, header: str) -> None:
    raw = header.encode()
    p = tmp_path / ("odd" + SUFFIX)
    p.write_bytes(MAGIC + struct.pack("<I", len(raw)) + raw + b"0123456789")
    with pytest.raises(StagingError):
        read_staged(p)
    assert not _mapped(p)


def test_not_a_staging_file(tmp_path: Path) -> None:
    p = tmp_path / ("foreign" + SUFFIX)
    p.write_bytes(b"PAR1" + b"\x00" * 100)
    with pytest.raises(StagingError, match="not a staging file"):
        read_staged(p)
    assert not _mapped(p)


def test_header_without_block_lengths(tmp_path: Path) -> None:
    raw = json.dumps({"rows": 1}).encode()
    p = tmp_path / ("nolen" + SUFFIX)
    p.write_bytes(MAGIC + struct.pack("<I", len(raw)) + raw)
    with pytest.raises(StagingError):
        read_staged(p)
    assert not _mapped(p)


def test_staging_error_is_a_value_error() -> None:
    assert issubclass(StagingError, ValueError)


# --- recovery ------------------------------------------------------------------------------------


def test_leftovers_removes_tmp_and_yields_shards(tmp_path: Path) -> None:
    a = write_staged(tmp_path, "a", {}, [b"x"])
    b = write_staged(tmp_path, "b", {}, [b"y"])
    half = tmp_path / ("c" + TMP_SUFFIX)
    half.write_bytes(MAGIC + b"\x10\x00")  # a sampler died mid-write
    half2 = tmp_path / ("d" + SUFFIX + TMP_SUFFIX)
    half2.write_bytes(b"")
    other = tmp_path / "notes.txt"
    other.write_text("keep me")
    got = list(leftovers(tmp_path))
    assert got == [a, b]
    assert not half.exists() and not half2.exists()
    assert other.exists()
    for p in got:
        read_staged(p).close()  # every yielded file is complete
    assert list(leftovers(tmp_path)) == [a, b]


def test_leftovers_of_an_empty_directory(tmp_path: Path) -> None:
    assert list(leftovers(tmp_path)) == []


# --- close ---------------------------------------------------------------------------------------


def test_close_releases_the_mapping(tmp_path: Path) -> None:
    path = write_staged(tmp_path, "m", {"rows": 9}, _blocks())
    shard = read_staged(path)
    first = shard.blocks[0]
    assert _mapped(path)
    shard.close()
    assert not _mapped(path)
    assert shard.blocks == []
    with pytest.raises(ValueError):
        first.tobytes()  # the block views are released, not dangling
    shard.close()  # idempotent
    # the file can now be rewritten and deleted
    write_staged(tmp_path, "m", {"rows": 1}, [b"new"])
    again = read_staged(path)
    assert [bytes(b) for b in again.blocks] == [b"new"]
    again.close()
    os.remove(path)
    assert not path.exists()


def test_many_open_close_cycles_do_not_leak_maps(tmp_path: Path) -> None:
    path = write_staged(tmp_path, "loop", {}, _blocks())
    for _ in range(200):
        read_staged(path).close()
    assert not _mapped(path)


# ------------------------------------------------------------------------- hostile staging dirs (issue 11)
@pytest.mark.parametrize("suffix", [TMP_SUFFIX, SUFFIX], ids=["tmp", "final"])
def test_a_planted_symlink_is_never_written_through(tmp_path: Path, suffix: str) -> None:
    stage = tmp_path / "staging"
    stage.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (stage / ("k1" + suffix)).symlink_to(victim)
    with pytest.raises(StagingError, match="symbolic link"):
        write_staged(stage, "k1", {"key": "k1"}, _blocks())
    assert victim.read_bytes() == b"precious"


def test_staging_files_are_0640_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = write_staged(tmp_path, "k3", {"key": "k3"}, _blocks())
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o640


def test_a_stale_tmp_file_of_a_killed_sampler_is_replaced(tmp_path: Path) -> None:
    (tmp_path / ("k4" + TMP_SUFFIX)).write_bytes(b"half written")
    path = write_staged(tmp_path, "k4", {"key": "k4"}, _blocks())
    got = read_staged(path)
    try:
        assert got.header["key"] == "k4" and len(got.blocks) == 3
    finally:
        got.close()


def test_leftovers_drop_links(tmp_path: Path) -> None:
    victim = tmp_path / "victim.shard"
    victim.write_bytes(b"x")
    stage = tmp_path / "staging"
    stage.mkdir()
    (stage / ("k5" + SUFFIX)).symlink_to(victim)
    assert list(leftovers(stage)) == []
    assert not os.path.lexists(stage / ("k5" + SUFFIX)) and victim.exists()
