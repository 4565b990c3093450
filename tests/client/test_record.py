"""client/samplecache/format/record.py: the shared record/wire format (schema JSON, blocks, keys)."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from samplecache.format.blockenc import ColumnData, encode_block
from samplecache.format.record import (
    ALIGN,
    FORMAT_VERSION,
    MAGIC,
    BlockView,
    Column,
    FormatError,
    Schema,
    block_checksum,
    decode_rows,
    parse_key,
    record_key,
    shard_prefix,
)

# --- helpers -------------------------------------------------------------------------------


def _var_column(values: list[np.ndarray], dtype: str) -> ColumnData:
    """ColumnData of a ``list`` column from per-row arrays (any ndim)."""
    flat = [np.asarray(v, dtype=dtype).reshape(-1) for v in values]
    lens = np.array([f.size for f in flat], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    data = np.concatenate(flat) if flat else np.zeros(0, dtype)
    ndim = max((np.ndim(v) for v in values), default=1)
    shapes = np.array([np.shape(v) for v in values], dtype=np.int32).reshape(len(values), ndim)
    return ColumnData(data=data.astype(dtype), offsets=offsets, shapes=shapes)


def _bytes_column(values: list[bytes]) -> ColumnData:
    lens = np.array([len(v) for v in values], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    data = np.frombuffer(b"".join(values), np.uint8)
    return ColumnData(data=data, offsets=offsets)


FIXED_DTYPES = ["|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"]


def _random_fixed(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)


# --- schema JSON ---------------------------------------------------------------------------


def test_column_json_round_trip_every_kind() -> None:
    cols = [
        Column("a", "fixed", "<f4", (), False),
        Column("t", "fixed", "<f2", (4, 3), True),
        Column("l", "list", "<i4", (-1,), True),
        Column("n", "list", "<f8", (-1, -1)),
        Column("m", "list", "|u1", (-1, 3)),
        Column("s", "string", None, (), True),
        Column("b", "binary"),
    ]
    for c in cols:
        j = c.to_json()
        assert j["shape"] == list(c.shape)
        assert Column.from_json(j) == c
        assert isinstance(Column.from_json(j).shape, tuple)


def test_schema_json_round_trip_and_lookup() -> None:
    s = Schema((Column("x", "fixed", "<f4", (2,)), Column("y", "string", nullable=True)))
    j = s.to_json()
    assert j["format_version"] == FORMAT_VERSION
    back = Schema.from_json(j)
    assert back == s
    assert back.names == ["x", "y"]
    assert back.index("y") == 1
    with pytest.raises(KeyError, match="nope"):
        back.index("nope")


@given(st.lists(st.tuples(st.sampled_from(["fixed", "list", "string", "binary"]),
                          st.sampled_from(FIXED_DTYPES),
                          st.lists(st.integers(-1, 6), max_size=3),
                          st.booleans()), min_size=1, max_size=6))
def test_schema_json_round_trip_property(specs: list) -> None:
    cols = tuple(Column(f"c{i}", k, None if k in ("string", "binary") else dt,
                        tuple(shape) if k in ("fixed", "list") else (), nullable)
                 for i, (k, dt, shape, nullable) in enumerate(specs))
    s = Schema(cols)
    assert Schema.from_json(json.loads(json.dumps(s.to_json()))) == s


def test_column_item_count() -> None:
    assert Column("a", "fixed", "<f4", ()).item_count == 1
    assert Column("a", "fixed", "<f4", (4, 3)).item_count == 12
    assert Column("a", "fixed", "<f4", (5,)).item_count == 5


def test_schema_version_mismatch_names_both_versions() -> None:
    other = FORMAT_VERSION + 1
    j = Schema((Column("x", "fixed", "<i4"),)).to_json()
    j["format_version"] = other
    with pytest.raises(FormatError) as ei:
        Schema.from_json(j)
    msg = str(ei.value)
    assert f"v{other}" in msg and f"v{FORMAT_VERSION}" in msg


def test_schema_without_version_is_rejected() -> None:
    with pytest.raises(FormatError, match=f"v{FORMAT_VERSION}"):
        Schema.from_json({"columns": [{"name": "x", "kind": "fixed", "dtype": "<i4"}]})


def test_unknown_column_kind_is_rejected() -> None:
    with pytest.raises(FormatError, match="tensor"):
        Column.from_json({"name": "x", "kind": "tensor", "dtype": "<f4"})


def test_format_error_is_a_value_error() -> None:
    assert issubclass(FormatError, ValueError)


# --- block framing -----------------------------------------------------------------------------


def _simple_block(version: int | None = None) -> tuple[bytes, Schema]:
    s = Schema((Column("x", "fixed", "<i4"),))
    blk = bytearray(encode_block(s, [ColumnData(data=np.arange(5, dtype=np.int32))], 5))
    if version is not None:
        blk[3] = version
    return bytes(blk), s


def test_block_header_layout() -> None:
    blk, s = _simple_block()
    assert blk[:4] == MAGIC == b"SCB" + bytes([FORMAT_VERSION])
    assert struct.unpack_from("<H", blk, 4)[0] == 1        # ncols
    assert struct.unpack_from("<I", blk, 8)[0] == 5        # nrows
    assert struct.unpack_from("<Q", blk, 16)[0] == block_checksum(blk)  # v3: the block's checksum
    assert struct.unpack_from("<Q", blk, 24)[0] == 0     # layout: dense
    data_off = struct.unpack_from("<Q", blk, 32)[0]
    assert data_off % ALIGN == 0
    assert len(blk) % ALIGN == 0
    assert np.frombuffer(blk, "<i4", 5, data_off).tolist() == [0, 1, 2, 3, 4]


def test_block_with_other_version_names_both_versions() -> None:
    other = FORMAT_VERSION + 1
    blk, s = _simple_block(version=other)
    with pytest.raises(FormatError) as ei:
        BlockView(blk, s)
    msg = str(ei.value)
    assert f"v{other}" in msg and f"v{FORMAT_VERSION}" in msg


def test_block_with_bad_magic() -> None:
    blk, s = _simple_block()
    bad = b"XYZ" + blk[3:]
    with pytest.raises(FormatError, match="magic"):
        BlockView(bad, s)


def test_block_column_count_mismatch() -> None:
    blk, _ = _simple_block()
    two = Schema((Column("x", "fixed", "<i4"), Column("y", "fixed", "<i4")))
    with pytest.raises(FormatError, match="columns"):
        BlockView(blk, two)
    with pytest.raises(FormatError, match="columns"):
        encode_block(two, [ColumnData(data=np.arange(3, dtype=np.int32))], 3)


# --- every kind ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FIXED_DTYPES)
@pytest.mark.parametrize("shape", [(), (4, 3), (5,)])
def test_fixed_round_trip(dtype: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{shape}".encode()))
    n = 7
    arr = _random_fixed(rng, dtype, (n,) + shape)
    s = Schema((Column("x", "fixed", dtype, shape),))
    blk = encode_block(s, [ColumnData(data=arr)], n)
    v = BlockView(blk, s)
    assert v.nrows == n
    col = v.column_array(0)
    assert col.dtype == np.dtype(dtype)
    assert col.shape == (n,) + shape
    assert col.tobytes() == arr.tobytes()  # bit-identical (NaN-safe)
    for i in range(n):
        got = v.value(0, i)
        assert np.asarray(got).dtype == np.dtype(dtype)
        assert np.shape(got) == shape
        assert np.asarray(got).tobytes() == arr[i].tobytes()
    rows = decode_rows(blk, s)
    assert len(rows) == n and all(set(r) == {"x"} for r in rows)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FIXED_DTYPES).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5))))
def test_fixed_round_trip_property(arr: np.ndarray) -> None:
    n, shape = arr.shape[0], arr.shape[1:]
    s = Schema((Column("x", "fixed", arr.dtype.str, shape),))
    blk = encode_block(s, [ColumnData(data=arr)], n)
    v = BlockView(blk, s)
    assert v.column_array(0).shape == arr.shape
    assert v.column_array(0).tobytes() == np.ascontiguousarray(arr).tobytes()
    rows = np.arange(n)[::-1]
    assert np.asarray(v.gather(rows, 0)).tobytes() == np.ascontiguousarray(arr[rows]).tobytes()


def test_bool_and_float16_values() -> None:
    s = Schema((Column("b", "fixed", "|b1"), Column("h", "fixed", "<f2")))
    b = np.array([True, False, True])
    h = np.array([0.5, -65504.0, np.inf], dtype=np.float16)
    blk = encode_block(s, [ColumnData(data=b), ColumnData(data=h)], 3)
    rows = decode_rows(blk, s)
    assert [bool(r["b"]) for r in rows] == [True, False, True]
    assert [type(r["b"]) for r in rows] == [np.bool_] * 3
    assert [float(r["h"]) for r in rows] == [0.5, -65504.0, float("inf")]
    assert all(r["h"].dtype == np.float16 for r in rows)


@pytest.mark.parametrize("shape,values", [
    ((-1,), [np.arange(3), np.arange(0), np.arange(7), np.arange(1)]),
    ((-1, -1), [np.arange(6).reshape(2, 3), np.zeros((0, 0)), np.ones((1, 1)), np.arange(8).reshape(4, 2),
                np.zeros((0, 5))]),
    ((-1, 3), [np.arange(6).reshape(2, 3), np.zeros((0, 3)), np.arange(3).reshape(1, 3)]),
])
@pytest.mark.parametrize("dtype", ["<f4", "<i8", "|u1", "<f2"])
def test_list_round_trip(shape: tuple[int, ...], values: list[np.ndarray], dtype: str) -> None:
    s = Schema((Column("l", "list", dtype, shape),))
    blk = encode_block(s, [_var_column(values, dtype)], len(values))
    v = BlockView(blk, s)
    for i, want in enumerate(values):
        got = v.value(0, i)
        assert got.dtype == np.dtype(dtype)
        assert got.shape == np.shape(want)
        np.testing.assert_array_equal(got, np.asarray(want, dtype=dtype))
    assert [r["l"].shape for r in decode_rows(blk, s)] == [np.shape(w) for w in values]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=0, max_size=12), st.integers(0, 2**31))
def test_list_2d_round_trip_property(shapes: list[tuple[int, int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(sh).astype("<f4") for sh in shapes]
    s = Schema((Column("l", "list", "<f4", (-1, -1)),))
    blk = encode_block(s, [_var_column(values, "<f4")], len(values))
    rows = decode_rows(blk, s)
    assert len(rows) == len(values)
    for r, want in zip(rows, values):
        assert r["l"].shape == want.shape
        assert r["l"].tobytes() == want.tobytes()


STRINGS = ["", "a", "héllo wörld", "中文字", "🙂🚀", "e\u0301", "", "x" * 1000, "\x00nul"]


def test_string_round_trip_non_ascii_and_empty() -> None:
    s = Schema((Column("s", "string"),))
    blk = encode_block(s, [_bytes_column([x.encode() for x in STRINGS])], len(STRINGS))
    got = [r["s"] for r in decode_rows(blk, s)]
    assert got == STRINGS
    assert all(type(g) is str for g in got)


def test_binary_round_trip_including_empty() -> None:
    vals = [b"", b"\x00\xff", bytes(range(256)), b"", b"z"]
    s = Schema((Column("b", "binary"),))
    blk = encode_block(s, [_bytes_column(vals)], len(vals))
    got = [r["b"] for r in decode_rows(blk, s)]
    assert got == vals
    assert all(type(g) is bytes for g in got)


def test_all_empty_binary_column_and_zero_rows() -> None:
    s = Schema((Column("b", "binary"),))
    blk = encode_block(s, [_bytes_column([b"", b""])], 2)
    assert [r["b"] for r in decode_rows(blk, s)] == [b"", b""]
    s2 = Schema((Column("x", "fixed", "<f4", (4, 3)), Column("s", "string")))
    blk2 = encode_block(s2, [ColumnData(data=np.zeros((0, 4, 3), np.float32)), _bytes_column([])], 0)
    v = BlockView(blk2, s2)
    assert v.nrows == 0
    assert v.column_array(0).shape == (0, 4, 3)
    assert decode_rows(blk2, s2) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(), max_size=20), st.lists(st.binary(max_size=50), max_size=20))
def test_string_binary_property(texts: list[str], blobs: list[bytes]) -> None:
    n = min(len(texts), len(blobs))
    texts, blobs = texts[:n], blobs[:n]
    s = Schema((Column("s", "string"), Column("b", "binary")))
    blk = encode_block(s, [_bytes_column([t.encode("utf-8", "surrogatepass") for t in texts]),
                           _bytes_column(blobs)], n)
    # hypothesis text() may contain lone surrogates; compare on the encoded form then.
    rows = BlockView(blk, s)
    for i in range(n):
        assert rows.value(1, i) == blobs[i]
        try:
            expect = texts[i].encode("utf-8")
        except UnicodeEncodeError:
            continue
        assert rows.value(0, i) == expect.decode("utf-8")


def test_nulls_via_valid_every_kind() -> None:
    valid = np.array([1, 0, 1, 0], dtype=bool)
    s = Schema((
        Column("f", "fixed", "<i4", (), True),
        Column("t", "fixed", "<f4", (2, 2), True),
        Column("l", "list", "<i2", (-1,), True),
        Column("s", "string", None, (), True),
        Column("b", "binary", None, (), True),
    ))
    f = ColumnData(data=np.arange(4, dtype=np.int32), valid=valid)
    t = ColumnData(data=np.arange(16, dtype=np.float32).reshape(4, 2, 2), valid=valid)
    lc = _var_column([np.arange(2), np.arange(0), np.arange(3), np.arange(0)], "<i2")
    lc.valid = valid
    sc = _bytes_column([b"a", b"", "é".encode(), b""])
    sc.valid = valid
    bc = _bytes_column([b"\x01", b"", b"", b""])
    bc.valid = valid.astype(np.uint8)
    blk = encode_block(s, [f, t, lc, sc, bc], 4)
    rows = decode_rows(blk, s)
    for i in (1, 3):
        assert rows[i] == {"f": None, "t": None, "l": None, "s": None, "b": None}
    assert rows[0]["f"] == 0 and rows[2]["f"] == 2
    np.testing.assert_array_equal(rows[2]["t"], np.arange(8, 12, dtype=np.float32).reshape(2, 2))
    assert rows[0]["l"].tolist() == [0, 1] and rows[2]["l"].tolist() == [0, 1, 2]
    assert rows[0]["s"] == "a" and rows[2]["s"] == "é"
    assert rows[0]["b"] == b"\x01" and rows[2]["b"] == b""
    v = BlockView(blk, s)
    # gather with nulls: a list, None at null positions
    assert v.gather(np.array([3, 2, 1, 0]), 0) == [None, 2, None, 0]


def test_column_selection_in_row_and_decode_rows() -> None:
    s = Schema((Column("a", "fixed", "<i4"), Column("b", "string"), Column("c", "fixed", "<f8")))
    blk = encode_block(s, [ColumnData(data=np.arange(3, dtype=np.int32)), _bytes_column([b"x", b"y", b"z"]),
                           ColumnData(data=np.arange(3, dtype=np.float64) / 2)], 3)
    rows = decode_rows(blk, s, cols=[2, 1])
    assert [list(r) for r in rows] == [["c", "b"]] * 3
    assert [r["b"] for r in rows] == ["x", "y", "z"]
    assert BlockView(blk, s).row(1, [0]) == {"a": 1}


# --- gather --------------------------------------------------------------------------------------


def test_gather_fixed_is_one_array_in_row_order() -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((10, 4, 3)).astype(np.float32)
    s = Schema((Column("x", "fixed", "<f4", (4, 3)), Column("s", "string")))
    blk = encode_block(s, [ColumnData(data=data), _bytes_column([str(i).encode() for i in range(10)])], 10)
    v = BlockView(blk, s)
    rows = np.array([7, 0, 7, 3])
    g = v.gather(rows, 0)
    assert isinstance(g, np.ndarray) and g.shape == (4, 4, 3)
    np.testing.assert_array_equal(g, data[rows])
    assert not np.shares_memory(g, v.column_array(0))
    assert v.gather(rows, 1) == ["7", "0", "7", "3"]
    assert v.gather(np.array([], dtype=np.int64), 0).shape == (0, 4, 3)


def test_gather_list_column() -> None:
    vals = [np.arange(i) for i in range(5)]
    s = Schema((Column("l", "list", "<i8", (-1,)),))
    blk = encode_block(s, [_var_column(vals, "<i8")], 5)
    g = BlockView(blk, s).gather(np.array([4, 1]), 0)
    assert isinstance(g, list)
    assert [x.tolist() for x in g] == [[0, 1, 2, 3], [0]]


# --- aliasing vs owned copies ---------------------------------------------------------------------------


def _mutable_block() -> tuple[bytearray, Schema, np.ndarray, list[np.ndarray]]:
    data = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    lists = [np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32)]
    s = Schema((Column("t", "fixed", "<f4", (4, 3)), Column("k", "fixed", "<i8"),
                Column("l", "list", "<i4", (-1,))))
    blk = encode_block(s, [ColumnData(data=data), ColumnData(data=np.array([5, 6], dtype=np.int64)),
                           _var_column(lists, "<i4")], 2)
    return bytearray(blk), s, data, lists


def test_column_array_aliases_the_buffer() -> None:
    buf, s, data, _ = _mutable_block()
    v = BlockView(buf, s)
    col = v.column_array(0)
    whole = np.frombuffer(buf, np.uint8)
    assert np.shares_memory(col, whole)
    # a write through the buffer is seen through the view (zero copy)
    data_off = struct.unpack_from("<Q", buf, 32)[0]
    np.frombuffer(buf, np.float32, 1, data_off)[0] = 1234.5
    assert col[0, 0, 0] == 1234.5


def test_column_array_on_memoryview_and_bytes_shares_memory() -> None:
    buf, s, _, _ = _mutable_block()
    raw = bytes(buf)
    mv = memoryview(raw)
    for b in (raw, mv):
        col = BlockView(b, s).column_array(0)
        assert np.shares_memory(col, np.frombuffer(raw, np.uint8))
        assert not col.flags.writeable  # read-only source stays read-only


def test_row_and_value_return_owned_copies() -> None:
    buf, s, data, lists = _mutable_block()
    before = bytes(buf)
    v = BlockView(buf, s)
    whole = np.frombuffer(buf, np.uint8)
    t = v.value(0, 1)
    lst = v.value(2, 0)
    row = v.row(1, [0, 1, 2])
    for a in (t, lst, row["t"], row["l"]):
        assert isinstance(a, np.ndarray)
        assert not np.shares_memory(a, whole)
        a[...] = 0  # writing the returned arrays ...
    assert bytes(buf) == before  # ... leaves the block untouched
    np.testing.assert_array_equal(v.column_array(0), data)
    # and a later write to the buffer does not reach an earlier copy
    t2 = v.value(0, 0)
    k = v.value(1, 0)
    v.column_array(0)[...] = -1
    np.testing.assert_array_equal(t2, data[0])
    assert k == 5


# --- keys --------------------------------------------------------------------------------------


def test_record_key_layout() -> None:
    k = record_key(0x0102030405060708, 0x0A0B0C0D)
    assert k == bytes([1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13])
    assert len(k) == 12
    assert k.startswith(shard_prefix(0x0102030405060708))
    assert parse_key(k) == (0x0102030405060708, 0x0A0B0C0D)


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)), min_size=1, max_size=50))
def test_record_keys_sort_by_shard_then_block(pairs: list[tuple[int, int]]) -> None:
    keys = [record_key(s, b) for s, b in pairs]
    assert [parse_key(k) for k in sorted(keys)] == sorted(pairs)
    for (s, b), k in zip(pairs, keys):
        assert parse_key(k) == (s, b)
        assert k[:8] == shard_prefix(s)


def test_keys_out_of_range_raise() -> None:
    with pytest.raises(OverflowError):
        record_key(-1, 0)
    with pytest.raises(OverflowError):
        record_key(0, 2**32)


def test_packed_shard_table_round_trips() -> None:
    from samplecache.format.manifest import pack_shard_table, unpack_shard_table

    table = [[5, 100, 4096, 40], [9, 7, 300, 7], [10, 1, 1 << 33, 1]]
    assert unpack_shard_table(pack_shard_table(table)).tolist() == table
    assert unpack_shard_table(pack_shard_table([])).shape == (0, 4)
    big = [[i * 3 + 1, 100, 5000, 40] for i in range(100_000)]
    assert len(pack_shard_table(big)) < len(str(big)) // 50
