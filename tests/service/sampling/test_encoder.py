"""service/samplecache_service/sampling/encoder.py: Arrow schema -> record schema, Arrow table -> record blocks."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from arrow_compare import assert_cells_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parquet_data import CONST_LIST_LEN, TENSOR_SHAPE, VEC_LEN, make_typed_table

from samplecache.format.record import BlockView, Column, Schema, decode_rows
from samplecache_service.remote.columns import UnsupportedColumn, column_for, infer_schema
from samplecache_service.sampling.encoder import DEFAULT_BLOCK_BYTES, encode_table

# (kind, dtype, shape) of every make_typed_table column, written out by hand.
EXPECTED = {
    "id": ("fixed", "<i8", ()),
    "i8": ("fixed", "|i1", ()),
    "u16": ("fixed", "<u2", ()),
    "i32": ("fixed", "<i4", ()),
    "f16": ("fixed", "<f2", ()),
    "f32": ("fixed", "<f4", ()),
    "f64": ("fixed", "<f8", ()),
    "flag": ("fixed", "|b1", ()),
    "tensor": ("fixed", "<f4", TENSOR_SHAPE),
    "vec": ("fixed", "<i2", (VEC_LEN,)),
    "const_list": ("list", "<f4", (-1,)),
    "var_list": ("list", "<i4", (-1,)),
    "nested": ("list", "<f8", (-1, -1)),
    "text": ("string", None, ()),
    "blob": ("binary", None, ()),
    "maybe_text": ("string", None, ()),
}


# --- comparing decoded values with Arrow's Python values ------------------------------------------


def decode_all(blocks: list[bytes], schema: Schema) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in blocks:
        out.extend(decode_rows(b, schema))
    return out


def assert_round_trip(table: pa.Table, schema: Schema, blocks: list[bytes]) -> None:
    """Every decoded cell is pyarrow's value of that cell, in the documented forms (arrow_compare)."""
    rows = decode_all(blocks, schema)
    assert len(rows) == table.num_rows
    for r in rows:
        assert list(r) == schema.names
    for c in schema.columns:
        assert_cells_equal([r[c.name] for r in rows], table.column(c.name), f"column {c.name}")


# --- schema inference --------------------------------------------------------------------------


def test_infer_schema_of_typed_table() -> None:
    t = make_typed_table(20, seed=0)
    schema, skipped = infer_schema(t.schema)
    assert skipped == {}
    assert schema.names == list(EXPECTED)
    for c in schema.columns:
        assert (c.kind, c.dtype, c.shape) == EXPECTED[c.name], c
        assert c.nullable is True  # Arrow fields are nullable by default
    # every dtype the schema names is one numpy reads back unchanged
    for c in schema.columns:
        if c.dtype is not None:
            assert np.dtype(c.dtype).str == c.dtype


def test_infer_schema_non_nullable_field() -> None:
    s = pa.schema([pa.field("x", pa.int32(), nullable=False)])
    schema, _ = infer_schema(s)
    assert schema.columns[0] == Column("x", "fixed", "<i4", (), False)


def test_columns_projection_keeps_the_requested_order() -> None:
    t = make_typed_table(5, seed=0)
    schema, skipped = infer_schema(t.schema, ["text", "id", "tensor"])
    assert schema.names == ["text", "id", "tensor"]
    assert skipped == {}
    blocks, _ = encode_table(t.select(schema.names), schema)
    assert_round_trip(t, schema, blocks)


def test_unknown_columns_are_an_error_naming_them() -> None:
    t = make_typed_table(5, seed=0)
    with pytest.raises(UnsupportedColumn) as ei:
        infer_schema(t.schema, ["id", "nope", "also_missing"])
    assert "nope" in str(ei.value) and "also_missing" in str(ei.value)


def test_unknown_column_error_names_the_source_columns_not_the_projection() -> None:
    """Discovery hands infer_schema the schema already cut down to the wanted columns; the message still lists
    every column the source has (``--columns id,nope`` on a file of ``id, s``)."""
    projected = pa.schema([pa.field("id", pa.int64())])
    with pytest.raises(UnsupportedColumn) as ei:
        infer_schema(projected, ["id", "nope"], source_names=["id", "s"])
    assert str(ei.value) == "columns ['nope'] are not in the source schema ['id', 's']"
    with pytest.raises(UnsupportedColumn, match=r"not in the source schema \['id'\]$"):
        infer_schema(projected, ["id", "nope"])  # without source_names: the schema it was given


def _odd_schema() -> pa.Schema:
    return pa.schema([
        pa.field("id", pa.int64()),
        pa.field("st", pa.struct([pa.field("a", pa.int32())])),
        pa.field("mp", pa.map_(pa.string(), pa.int32())),
        pa.field("strs", pa.list_(pa.string())),
    ])


def _odd_table() -> pa.Table:
    return pa.table({
        "id": pa.array([0, 1, 2, 3], pa.int64()),
        "st": pa.array([{"a": 1}, None, {"a": None}, {"a": -4}], pa.struct([pa.field("a", pa.int32())])),
        "mp": pa.array([[("x", 1), ("y", None)], [], None, [("z", 3)]], pa.map_(pa.string(), pa.int32())),
        "strs": pa.array([["a", None, ""], None, [], ["中文"]], pa.list_(pa.string())),
    }, schema=_odd_schema())


def test_structs_maps_and_lists_of_strings_are_served() -> None:
    schema, skipped = infer_schema(_odd_schema())
    assert skipped == {}
    assert schema.names == ["id", "st", "mp", "strs"]
    kinds = {c.name: c.kind for c in schema.columns}
    assert kinds == {"id": "fixed", "st": "nested", "mp": "nested", "strs": "nested"}
    by = {c.name: c for c in schema.columns}
    assert by["st"].type == {"t": "struct", "fields": [["a", {"t": "prim", "dtype": "<i4"}]]}
    assert by["mp"].type == {"t": "map", "key": {"t": "string"}, "value": {"t": "prim", "dtype": "<i4"}}
    assert by["strs"].type == {"t": "list", "child": {"t": "string"}}
    assert by["mp"].arrow == "map<string, int32>"
    t = _odd_table()
    for bb in (1, 1 << 20):
        blocks, _ = encode_table(t, schema, bb)
        assert_round_trip(t, schema, blocks)
    rows = decode_all(encode_table(t, schema)[0], schema)
    assert [r["st"] for r in rows] == [{"a": 1}, None, {"a": None}, {"a": -4}]
    assert [r["mp"] for r in rows] == [[("x", 1), ("y", None)], [], None, [("z", 3)]]
    assert [r["strs"] for r in rows] == [["a", None, ""], None, [], ["中文"]]


@pytest.mark.parametrize("name", ["st", "mp", "strs"])
def test_nested_type_asked_for_explicitly_is_served(name: str) -> None:
    schema, skipped = infer_schema(_odd_schema(), ["id", name])
    assert schema.names == ["id", name] and skipped == {}
    t = _odd_table().select(["id", name])
    assert_round_trip(t, schema, encode_table(t, schema, 1)[0])


def _unservable_schema() -> pa.Schema:
    # not Parquet types: Arrow types the record format has no node for
    return pa.schema([pa.field("u", pa.dense_union([pa.field("a", pa.int8())])),
                      pa.field("iv", pa.month_day_nano_interval())])


def test_no_servable_column_raises() -> None:
    with pytest.raises(UnsupportedColumn, match="no column can be served: ") as ei:
        infer_schema(_unservable_schema())
    assert "u (" in str(ei.value) and "iv (" in str(ei.value)


def test_unservable_columns_are_skipped_with_a_reason() -> None:
    s = pa.schema(list(_unservable_schema()) + [pa.field("id", pa.int64())])
    schema, skipped = infer_schema(s)
    assert schema.names == ["id"]
    assert set(skipped) == {"u", "iv"}
    assert "union" in skipped["u"] and "not supported" in skipped["u"]
    assert "interval" in skipped["iv"]


@pytest.mark.parametrize("name", ["u", "iv"])
def test_unservable_column_asked_for_explicitly_raises(name: str) -> None:
    s = pa.schema(list(_unservable_schema()) + [pa.field("id", pa.int64())])
    with pytest.raises(UnsupportedColumn, match=name):
        infer_schema(s, ["id", name])


@pytest.mark.parametrize("arrow_type,expect", [
    (pa.timestamp("ms"), ("fixed", "<M8[ms]", ())),
    (pa.timestamp("ns", tz="UTC"), ("fixed", "<M8[ns]", ())),
    (pa.date32(), ("fixed", "<M8[D]", ())),
    (pa.date64(), ("fixed", "<M8[ms]", ())),
    (pa.duration("s"), ("fixed", "<m8[s]", ())),
    (pa.time32("ms"), ("fixed", "<m8[ms]", ())),
    (pa.time64("ns"), ("fixed", "<m8[ns]", ())),
    (pa.dictionary(pa.int8(), pa.string()), ("string", None, ())),
    (pa.dictionary(pa.int32(), pa.int64()), ("fixed", "<i8", ())),
    (pa.large_string(), ("string", None, ())),
    (pa.string_view(), ("string", None, ())),
    (pa.large_binary(), ("binary", None, ())),
    (pa.binary(4), ("binary", None, ())),
    (pa.large_list(pa.int16()), ("list", "<i2", (-1,))),
    (pa.list_(pa.list_(pa.float32(), 3)), ("list", "<f4", (-1, 3))),
    (pa.list_(pa.list_(pa.uint8(), 2), 5), ("fixed", "|u1", (5, 2))),
    (pa.list_(pa.list_(pa.int8()), 2), ("list", "|i1", (2, -1))),
    (pa.list_(pa.timestamp("us"), 2), ("fixed", "<M8[us]", (2,))),
    (pa.list_(pa.date32()), ("list", "<M8[D]", (-1,))),
    (pa.struct([pa.field("a", pa.int8())]), ("nested", None, ())),
    (pa.map_(pa.string(), pa.float32()), ("nested", None, ())),
    (pa.decimal128(10, 2), ("nested", None, ())),
    (pa.decimal256(70, 5), ("nested", None, ())),
    (pa.null(), ("nested", None, ())),
    (pa.list_(pa.string()), ("nested", None, ())),
    (pa.list_(pa.struct([pa.field("a", pa.int8())])), ("nested", None, ())),
    (pa.list_(pa.decimal128(5, 1)), ("nested", None, ())),
])
def test_column_for_types(arrow_type: pa.DataType, expect: tuple) -> None:
    c = column_for(pa.field("x", arrow_type))
    assert (c.kind, c.dtype, c.shape) == expect
    assert c.arrow == str(arrow_type)
    # the column's JSON round trips, type tree included
    assert Column.from_json(c.to_json()) == c
    assert Column.from_json(c.to_json()).type_node() == c.type_node()


def test_column_type_trees() -> None:
    assert column_for(pa.field("x", pa.decimal128(10, 2))).type == {"t": "decimal", "width": 16, "scale": 2}
    assert column_for(pa.field("x", pa.decimal256(70, 5))).type == {"t": "decimal", "width": 32, "scale": 5}
    assert column_for(pa.field("x", pa.null())).type == {"t": "null"}
    assert column_for(pa.field("x", pa.list_(pa.binary(3)))).type == \
        {"t": "list", "child": {"t": "fixed_binary", "width": 3}}
    ts = column_for(pa.field("x", pa.list_(pa.timestamp("ms", tz="Asia/Tokyo"), 2)))
    assert ts.tz == "Asia/Tokyo"
    assert ts.type == {"t": "list", "size": 2, "child": {"t": "prim", "dtype": "<M8[ms]", "tz": "Asia/Tokyo"}}
    st_ = column_for(pa.field("x", pa.struct([pa.field("when", pa.timestamp("s", tz="UTC")),
                                              pa.field("m", pa.map_(pa.int8(), pa.list_(pa.bool_())))])))
    assert st_.type == {"t": "struct", "fields": [
        ["when", {"t": "prim", "dtype": "<M8[s]", "tz": "UTC"}],
        ["m", {"t": "map", "key": {"t": "prim", "dtype": "|i1"},
               "value": {"t": "list", "child": {"t": "prim", "dtype": "|b1"}}}]]}


def test_schema_json_keeps_type_tz_arrow_and_info() -> None:
    s = pa.schema([pa.field("when", pa.timestamp("us", tz="Europe/Paris")), pa.field("label", pa.int64()),
                   pa.field("st", pa.struct([pa.field("a", pa.list_(pa.string()))]))],
                  metadata={b"huggingface": json.dumps({"info": {"features": {
                      "label": {"_type": "ClassLabel", "names": ["cat", "dog"]},
                      "st": {"a": {"feature": {"dtype": "string", "_type": "Value"}, "_type": "Sequence"}},
                  }}}).encode()})
    schema, _ = infer_schema(s)
    back = Schema.from_json(json.loads(json.dumps(schema.to_json())))
    assert back == schema
    for c, d in zip(schema.columns, back.columns):
        assert (d.type_node(), d.tz, d.arrow, d.info) == (c.type_node(), c.tz, c.arrow, c.info)
    by = {c.name: c for c in back.columns}
    assert by["when"].tz == "Europe/Paris" and by["when"].dtype == "<M8[us]"
    assert by["label"].info == {"hf_feature": "ClassLabel", "class_names": ["cat", "dog"]}
    assert by["when"].info is None
    assert by["st"].info == {"hf_feature": "dict"}


# --- encode + decode ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def typed() -> tuple[pa.Table, Schema]:
    t = make_typed_table(150, seed=3, id_offset=1000)
    return t, infer_schema(t.schema)[0]


@pytest.mark.parametrize("block_bytes", [1, 300, 4096, DEFAULT_BLOCK_BYTES, 1 << 40])
def test_round_trip_typed_table(typed: tuple[pa.Table, Schema], block_bytes: int) -> None:
    t, schema = typed
    blocks, rows_per_block = encode_table(t, schema, block_bytes)
    assert rows_per_block >= 1
    assert len(blocks) == -(-t.num_rows // rows_per_block)
    sizes = [BlockView(b, schema).nrows for b in blocks]
    assert sizes[:-1] == [rows_per_block] * (len(blocks) - 1)
    assert sum(sizes) == t.num_rows
    assert_round_trip(t, schema, blocks)


def test_tiny_block_bytes_gives_one_row_per_block(typed: tuple[pa.Table, Schema]) -> None:
    t, schema = typed
    blocks, rpb = encode_table(t, schema, 1)
    assert rpb == 1 and len(blocks) == t.num_rows


def test_huge_block_bytes_gives_one_block(typed: tuple[pa.Table, Schema]) -> None:
    t, schema = typed
    blocks, rpb = encode_table(t, schema, 1 << 40)
    assert rpb == t.num_rows and len(blocks) == 1


def test_default_block_size_is_near_target() -> None:
    t = make_typed_table(3000, seed=1)
    schema, _ = infer_schema(t.schema)
    blocks, rpb = encode_table(t, schema, 64 * 1024)
    assert len(blocks) > 3
    # blocks land in the neighbourhood of the target (alignment and per-row estimates aside)
    assert max(len(b) for b in blocks) < 4 * 64 * 1024


def test_empty_table_encodes_to_no_blocks(typed: tuple[pa.Table, Schema]) -> None:
    t, schema = typed
    assert encode_table(t.slice(0, 0), schema) == ([], 1)


@pytest.mark.parametrize("start,length", [(0, 1), (1, 1), (3, 40), (17, 100), (149, 1), (60, 90), (0, 150)])
@pytest.mark.parametrize("block_bytes", [1, 2000, 1 << 40])
def test_round_trip_sliced_table(typed: tuple[pa.Table, Schema], start: int, length: int, block_bytes: int) -> None:
    t, schema = typed
    part = t.slice(start, length)
    blocks, _ = encode_table(part, schema, block_bytes)
    assert_round_trip(part, schema, blocks)
    assert decode_all(blocks, schema)[0]["id"] == 1000 + start


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), n=st.integers(1, 80), data=st.data())
def test_round_trip_property(seed: int, n: int, data: st.DataObject) -> None:
    t = make_typed_table(n, seed=seed)
    start = data.draw(st.integers(0, n - 1))
    length = data.draw(st.integers(1, n - start))
    block_bytes = data.draw(st.sampled_from([1, 500, 5000, 1 << 30]))
    schema, _ = infer_schema(t.schema)
    part = t.slice(start, length)
    blocks, _ = encode_table(part, schema, block_bytes)
    assert_round_trip(part, schema, blocks)


def test_round_trip_multi_chunk_table() -> None:
    t = pa.concat_tables([make_typed_table(30, seed=1), make_typed_table(25, seed=2, id_offset=30)])
    assert t.column("tensor").num_chunks == 2
    schema, _ = infer_schema(t.schema)
    for part in (t, t.slice(20, 20), t.slice(29, 2)):  # the slices cross the chunk boundary
        for bb in (1, 1 << 30):
            blocks, _ = encode_table(part, schema, bb)
            assert_round_trip(part, schema, blocks)


def test_decoded_ids_are_exact(typed: tuple[pa.Table, Schema]) -> None:
    t, schema = typed
    blocks, _ = encode_table(t, schema, 777)
    assert [int(r["id"]) for r in decode_all(blocks, schema)] == list(range(1000, 1150))
    # the per-column fixed array of a block is one vectorised view of the right shape
    v = BlockView(blocks[0], schema)
    assert v.column_array(schema.index("tensor")).shape == (v.nrows,) + TENSOR_SHAPE
    assert v.column_array(schema.index("vec")).dtype == np.int16
    const = [r["const_list"] for r in decode_rows(blocks[0], schema)]
    assert all(c.shape == (CONST_LIST_LEN,) for c in const)


def test_nested_shapes(typed: tuple[pa.Table, Schema]) -> None:
    t, schema = typed
    blocks, _ = encode_table(t.slice(0, 3), schema, 1 << 30)
    rows = decode_all(blocks, schema)
    # make_typed_table pins rows 0-2 of `nested` to 2x3, 1x1 and empty
    assert [r["nested"].shape for r in rows] == [(2, 3), (1, 1), (0, 0)]


# --- nulls, ragged rows, dictionaries, temporal types ----------------------------------------------


def test_nulls_in_every_kind() -> None:
    t = pa.table({
        "i": pa.array([1, None, 3], pa.int32()),
        "b": pa.array([True, None, False]),
        "h": pa.array([np.float16(1.5), None, np.float16(-2)], pa.float16()),
        "fsl": pa.array([[1.0, 2.0], None, [5.0, 6.0]], pa.list_(pa.float32(), 2)),
        "l": pa.array([[1], None, []], pa.list_(pa.int64())),
        "ll": pa.array([None, [[1.0, 2.0]], []], pa.list_(pa.list_(pa.float64()))),
        "s": pa.array(["a", None, ""]),
        "bin": pa.array([None, b"x", b""]),
    })
    schema, skipped = infer_schema(t.schema)
    assert skipped == {}
    blocks, _ = encode_table(t, schema, 1 << 30)
    assert_round_trip(t, schema, blocks)
    rows = decode_all(blocks, schema)
    assert rows[1]["i"] is None and rows[1]["fsl"] is None and rows[1]["l"] is None and rows[0]["ll"] is None
    assert rows[2]["l"].shape == (0,)


def test_ragged_nested_rows_round_trip_as_lists() -> None:
    t = pa.table({"n": pa.array([[[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0]]], pa.list_(pa.list_(pa.float64())))})
    schema, _ = infer_schema(t.schema)
    for bb in (1, 1 << 20):
        assert_round_trip(t, schema, encode_table(t, schema, bb)[0])
    rows = decode_all(encode_table(t, schema)[0], schema)
    # the rectangular row is still an array, the ragged one is as_py's list
    assert isinstance(rows[0]["n"], np.ndarray) and rows[0]["n"].shape == (2, 2)
    assert rows[1]["n"] == [[1.0, 2.0], [3.0]]
    assert all(type(x) is float for x in rows[1]["n"][1])


def test_ragged_row_in_any_slice_round_trips() -> None:
    t = pa.table({"n": pa.array([[[1.0], [2.0, 3.0]], [[4.0, 5.0]], [], [[6.0], [7.0]], [[8.0, 9.0], []]],
                                pa.list_(pa.list_(pa.float64())))})
    schema, _ = infer_schema(t.schema)
    for part in (t, t.slice(1, 3), t.slice(0, 2), t.slice(4, 1)):
        for bb in (1, 1 << 30):
            assert_round_trip(part, schema, encode_table(part, schema, bb)[0])
    # a block with no ragged row keeps the dense layout: every cell an array
    part = t.slice(1, 3)
    v = BlockView(encode_table(part, schema, 1 << 30)[0][0], schema)
    assert not v.has_nulls(0)
    assert [v.value(0, i).shape for i in range(3)] == [(1, 2), (0, 0), (2, 1)]
    rows = decode_all(encode_table(t, schema, 1 << 30)[0], schema)
    assert rows[0]["n"] == [[1.0], [2.0, 3.0]] and rows[4]["n"] == [[8.0, 9.0], []]
    assert rows[1]["n"].shape == (1, 2)


def test_ragged_inside_fixed_size_outer_round_trips() -> None:
    t = pa.table({"n": pa.array([[[1], [2]], [[1, 2], [3]]], pa.list_(pa.list_(pa.int8()), 2))})
    schema, _ = infer_schema(t.schema)
    assert schema.columns[0].shape == (2, -1)
    for part in (t, t.slice(0, 1), t.slice(1, 1)):
        for bb in (1, 1 << 20):
            assert_round_trip(part, schema, encode_table(part, schema, bb)[0])
    rows = decode_all(encode_table(t, schema)[0], schema)
    assert rows[0]["n"].dtype == np.int8 and rows[0]["n"].shape == (2, 1)
    assert rows[1]["n"] == [[1, 2], [3]]


def test_null_elements_inside_lists_round_trip_as_lists() -> None:
    t = pa.table({
        "fsl": pa.array([[1.0, None], [3.0, 4.0], None], pa.list_(pa.float32(), 2)),
        "l": pa.array([[1, None, 3], [4], None, []], pa.list_(pa.int16())).slice(0, 3),
        "ll": pa.array([[[1.0], None], [[2.0, 3.0]], [[None]]], pa.list_(pa.list_(pa.float64()))),
        "ts": pa.array([[0, None], [5, 6], None], pa.list_(pa.int64())).cast(pa.list_(pa.timestamp("ms"))),
    })
    schema, _ = infer_schema(t.schema)
    assert [c.kind for c in schema.columns] == ["fixed", "list", "list", "list"]
    for part in (t, t.slice(1), t.slice(2)):
        for bb in (1, 1 << 20):
            assert_round_trip(part, schema, encode_table(part, schema, bb)[0])
    rows = decode_all(encode_table(t, schema)[0], schema)
    assert rows[0]["fsl"] == [1.0, None] and type(rows[0]["fsl"][0]) is float
    assert rows[1]["fsl"].dtype == np.float32  # the block has a null element; a clean row is still an array
    assert rows[0]["l"] == [1, None, 3] and type(rows[0]["l"][0]) is int
    assert rows[0]["ll"] == [[1.0], None] and rows[2]["ll"] == [[None]]
    assert rows[0]["ts"] == [np.datetime64(0, "ms"), None]
    assert rows[0]["ts"][0].dtype == np.dtype("<M8[ms]")
    v = BlockView(encode_table(t, schema)[0][0], schema)
    mask = v.column_mask(0)
    assert mask is not None and mask.tolist() == [[True, False], [True, True], [False, False]]


def test_list_of_fixed_size_lists() -> None:
    t = pa.table({"p": pa.array([[[1.0, 2.0, 3.0]], [], [[4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]],
                                pa.list_(pa.list_(pa.float32(), 3)))})
    schema, _ = infer_schema(t.schema)
    for part in (t, t.slice(1, 2), t.slice(2, 1)):
        blocks, _ = encode_table(part, schema, 1)
        assert_round_trip(part, schema, blocks)
    rows = decode_all(encode_table(t, schema)[0], schema)
    assert [r["p"].shape for r in rows] == [(1, 3), (0, 3), (2, 3)]


def test_dictionary_encoded_strings() -> None:
    words = ["alpha", "βeta", None, "", "alpha", "中文", None, "βeta"]
    t = pa.table({"w": pa.array(words).dictionary_encode(), "k": pa.array(range(8), pa.int32())})
    assert pa.types.is_dictionary(t.schema.field("w").type)
    schema, _ = infer_schema(t.schema)
    assert schema.columns[0].kind == "string"
    for part in (t, t.slice(2, 5)):
        for bb in (1, 1 << 30):
            blocks, _ = encode_table(part, schema, bb)
            assert [r["w"] for r in decode_all(blocks, schema)] == part.column("w").to_pylist()


def test_dictionary_encoded_integers() -> None:
    t = pa.table({"d": pa.array([7, 7, None, 9], pa.int64()).dictionary_encode()})
    schema, _ = infer_schema(t.schema)
    assert schema.columns[0].kind == "fixed" and schema.columns[0].dtype == "<i8"
    rows = decode_all(encode_table(t, schema)[0], schema)
    assert [None if r["d"] is None else int(r["d"]) for r in rows] == [7, 7, None, 9]


@pytest.mark.parametrize("arrow_type", [pa.timestamp("s"), pa.timestamp("ms"), pa.timestamp("us"),
                                        pa.timestamp("ns", tz="Europe/Paris"), pa.timestamp("s", tz="+05:30"),
                                        pa.date64(), pa.duration("ms"), pa.duration("ns")])
def test_temporal_values_become_datetime64_with_the_unit(arrow_type: pa.DataType) -> None:
    if pa.types.is_duration(arrow_type):
        values = [dt.timedelta(seconds=1), None, dt.timedelta(days=-3, milliseconds=5)]
    elif pa.types.is_date(arrow_type):
        values = [dt.date(1970, 1, 2), None, dt.date(2024, 2, 29)]
    else:
        values = [dt.datetime(2020, 1, 1, 12, 0, 1), None, dt.datetime(1969, 12, 31, 23, 59, 59)]
    base = pa.timestamp(arrow_type.unit) if pa.types.is_timestamp(arrow_type) else arrow_type
    arr = pa.array(values, base).cast(arrow_type)
    t = pa.table({"t": arr})
    schema, _ = infer_schema(t.schema)
    col = schema.columns[0]
    kind = "M" if not pa.types.is_duration(arrow_type) else "m"
    unit = "ms" if pa.types.is_date64(arrow_type) else arrow_type.unit
    assert col == Column("t", "fixed", f"<{kind}8[{unit}]", (), True,
                         tz=getattr(arrow_type, "tz", None) or None)
    rows = decode_all(encode_table(t, schema)[0], schema)
    got = [r["t"] for r in rows]
    assert got[1] is None
    assert all(g.dtype == np.dtype(f"{kind}8[{unit}]") for g in (got[0], got[2]))
    # the exact integers Arrow stores (UTC instants for time zones)
    want = arr.cast(pa.int64()).to_pylist()
    assert [None if g is None else int(g.astype(np.int64)) for g in got] == want
    assert_round_trip(t, schema, encode_table(t, schema, 1)[0])


def test_timestamp_with_tz_is_the_utc_instant() -> None:
    arr = pa.array([dt.datetime(2021, 6, 1, 12, tzinfo=dt.timezone.utc)], pa.timestamp("us", tz="Asia/Kolkata"))
    t = pa.table({"t": arr})
    schema, _ = infer_schema(t.schema)
    assert schema.columns[0].tz == "Asia/Kolkata"
    assert schema.columns[0].type == {"t": "prim", "dtype": "<M8[us]", "tz": "Asia/Kolkata"}
    got = decode_all(encode_table(t, schema)[0], schema)[0]["t"]
    assert got == np.datetime64("2021-06-01T12:00:00", "us")
    assert got.dtype == np.dtype("<M8[us]")


def test_date32_becomes_datetime64_days() -> None:
    t = pa.table({"d": pa.array([dt.date(1970, 1, 1), dt.date(2000, 3, 1), None, dt.date(1, 1, 1)], pa.date32())})
    schema, _ = infer_schema(t.schema)
    assert schema.columns[0].dtype == "<M8[D]"
    rows = decode_all(encode_table(t, schema)[0], schema)
    got = [r["d"] for r in rows]
    assert got[:3] == [np.datetime64("1970-01-01"), np.datetime64("2000-03-01"), None]
    assert got[3] == np.datetime64("0001-01-01") and got[3].dtype == np.dtype("<M8[D]")
    assert int(got[1].astype(np.int64)) == 11017


@pytest.mark.parametrize("arrow_type", [pa.time32("s"), pa.time32("ms"), pa.time64("us"), pa.time64("ns")])
def test_times_become_timedelta64_since_midnight(arrow_type: pa.DataType) -> None:
    values = [dt.time(0, 0, 0), None, dt.time(23, 59, 59), dt.time(12, 30, 1)]
    arr = pa.array(values, arrow_type)
    t = pa.table({"t": arr})
    schema, _ = infer_schema(t.schema)
    assert schema.columns[0].dtype == f"<m8[{arrow_type.unit}]"
    got = [r["t"] for r in decode_all(encode_table(t, schema)[0], schema)]
    assert got[1] is None
    assert got[2] == np.timedelta64(23 * 3600 + 59 * 60 + 59, "s")
    assert got[2].dtype == np.dtype(f"<m8[{arrow_type.unit}]")
    assert_round_trip(t, schema, encode_table(t, schema, 1)[0])


def test_timestamps_inside_fixed_size_list() -> None:
    arr = pa.array([[0, 1], [2, 3]], pa.list_(pa.int64(), 2)).cast(pa.list_(pa.timestamp("us"), 2))
    t = pa.table({"ts": arr})
    schema, _ = infer_schema(t.schema)
    assert schema.columns[0] == Column("ts", "fixed", "<M8[us]", (2,), True)
    rows = decode_all(encode_table(t, schema)[0], schema)
    assert [r["ts"].dtype for r in rows] == [np.dtype("<M8[us]")] * 2
    assert [r["ts"].astype(np.int64).tolist() for r in rows] == [[0, 1], [2, 3]]
    tz = pa.table({"ts": arr.cast(pa.list_(pa.timestamp("us", tz="UTC"), 2))})
    schema_tz, _ = infer_schema(tz.schema)
    assert schema_tz.columns[0] == Column("ts", "fixed", "<M8[us]", (2,), True, tz="UTC")
    assert schema_tz.columns[0] != schema.columns[0]  # the time zone is part of the column


def test_decimals_are_exact() -> None:
    vals = [Decimal("1.50"), None, Decimal("-0.01"), Decimal("99999999.99"), Decimal("0.00")]
    big = [Decimal("1" * 60 + ".12345"), None, Decimal("-" + "9" * 65 + ".00001"), Decimal("0.00000"),
           Decimal("-1.00000")]
    t = pa.table({"d": pa.array(vals, pa.decimal128(10, 2)), "big": pa.array(big, pa.decimal256(70, 5)),
                  "ld": pa.array([[Decimal("1.5"), None], None, [], [Decimal("-2.5")], [Decimal("0.0")]],
                                 pa.list_(pa.decimal128(3, 1)))})
    schema, _ = infer_schema(t.schema)
    for bb in (1, 1 << 20):
        assert_round_trip(t, schema, encode_table(t, schema, bb)[0])
    rows = decode_all(encode_table(t, schema)[0], schema)
    assert [str(r["d"]) for r in rows] == ["1.50", "None", "-0.01", "99999999.99", "0.00"]
    assert rows[2]["big"] == big[2] and rows[2]["big"].as_tuple() == big[2].as_tuple()
    assert rows[0]["ld"] == [Decimal("1.5"), None]


def test_null_type_column_is_all_none() -> None:
    t = pa.table({"z": pa.nulls(5), "id": pa.array(range(5), pa.int8())})
    schema, skipped = infer_schema(t.schema)
    assert skipped == {} and schema.columns[0].kind == "nested"
    for bb in (1, 1 << 20):
        rows = decode_all(encode_table(t, schema, bb)[0], schema)
        assert [r["z"] for r in rows] == [None] * 5
    # the null column last in the block, too
    t2 = t.select(["id", "z"])
    schema2, _ = infer_schema(t2.schema)
    assert [r["z"] for r in decode_all(encode_table(t2, schema2, 1)[0], schema2)] == [None] * 5


def test_dictionary_chunks_with_different_dictionaries() -> None:
    a = pa.array(["x", "y"]).dictionary_encode()
    b = pa.array(["z", "x", None]).dictionary_encode()
    t = pa.table({"w": pa.chunked_array([a, b])})
    schema, _ = infer_schema(t.schema)
    for part in (t, t.slice(1, 3)):
        blocks, _ = encode_table(part, schema, 1 << 20)
        assert [r["w"] for r in decode_all(blocks, schema)] == part.column("w").to_pylist()


def test_null_list_row_with_hidden_values() -> None:
    """A null list slot may still span values in Arrow; they must not leak into the next rows."""
    la = pa.ListArray.from_arrays(pa.array([0, 2, 4, 5], pa.int32()), pa.array([1, 2, 3, 4, 5], pa.int32()),
                                  mask=pa.array([False, True, False]))
    t = pa.table({"l": la})
    schema, _ = infer_schema(t.schema)
    for part in (t, t.slice(1), t.slice(2)):
        for bb in (1, 1 << 20):
            assert_round_trip(part, schema, encode_table(part, schema, bb)[0])


def test_sliced_large_and_fixed_size_binary() -> None:
    t = pa.table({"s": pa.array(["ab", "c", "", "déf"], pa.large_string()),
                  "f": pa.array([b"ab", b"cd", b"ef", None], pa.binary(2))})
    schema, _ = infer_schema(t.schema)
    for part in (t, t.slice(1), t.slice(2, 2)):
        for bb in (1, 1 << 20):
            assert_round_trip(part, schema, encode_table(part, schema, bb)[0])


# --- list views and canonical extension types -------------------------------------------------------


def test_list_view_columns_round_trip() -> None:
    t = pa.table({"v": pa.array([[1, 2], [3], None, [4, 5, 6]], pa.list_view(pa.int16())),
                  "lv": pa.array([[1.5], [], None, [2.5, 3.5]], pa.large_list_view(pa.float32())),
                  "s": pa.array([["a"], ["b", "c"], None, ["d"]], pa.list_view(pa.string()))})
    schema, _ = infer_schema(t.schema)
    assert [c.kind for c in schema.columns] == ["list", "list", "nested"]
    for bb in (1, 1 << 20):
        assert_round_trip(t, schema, encode_table(t, schema, bb)[0])


_U1, _U2 = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), uuid.UUID(int=1)


def _ext(ext_type: pa.DataType, values: list[Any]) -> pa.Array:
    return pa.ExtensionArray.from_storage(ext_type, pa.array(values, ext_type.storage_type))


# (array, (kind, dtype, shape), the decoded cells): each canonical extension type pyarrow knows, nested ones too
CANONICAL = {
    "uuid": (_ext(pa.uuid(), [_U1.bytes, None, _U2.bytes]), ("binary", None, ()), [_U1, None, _U2]),
    "json": (_ext(pa.json_(), ['{"a": 1}', None, "[]"]), ("string", None, ()), ['{"a": 1}', None, "[]"]),
    "large_json": (_ext(pa.json_(pa.large_string()), ["1", None, '"x"']), ("string", None, ()), ["1", None, '"x"']),
    "bool8": (_ext(pa.bool8(), [1, None, -3]), ("fixed", "|b1", ()), [np.True_, None, np.True_]),
    "tensor": (_ext(pa.fixed_shape_tensor(pa.float32(), (2, 3)), [list(range(6)), None, [0.5] * 6]),
               ("fixed", "<f4", (2, 3)), [np.arange(6, dtype=np.float32).reshape(2, 3), None,
                                          np.full((2, 3), 0.5, np.float32)]),
    # stored order, the type's shape: a permutation is not applied (it is in the column's arrow type)
    "tensor_permuted": (_ext(pa.fixed_shape_tensor(pa.int16(), (2, 3), permutation=[1, 0]), [list(range(6))] * 3),
                        ("fixed", "<i2", (2, 3)), [np.arange(6, dtype=np.int16).reshape(2, 3)] * 3),
    "tensor_0d": (_ext(pa.fixed_shape_tensor(pa.int8(), ()), [[7], None, [-1]]), ("fixed", "|i1", ()),
                  [np.int8(7), None, np.int8(-1)]),
    "tensor_null_inside": (_ext(pa.fixed_shape_tensor(pa.int32(), (1, 2)), [[1, None], [2, 3], None]),
                           ("fixed", "<i4", (1, 2)), [[[1, None]], np.array([[2, 3]], np.int32), None]),
    "tensor_empty": (_ext(pa.fixed_shape_tensor(pa.int8(), (3, 0)), [[], None, []]), ("fixed", "|i1", (3, 0)),
                     [np.zeros((3, 0), np.int8), None, np.zeros((3, 0), np.int8)]),
    "opaque": (_ext(pa.opaque(pa.binary(), "geometry", "postgis"), [b"\x01", None, b""]), ("binary", None, ()),
               [b"\x01", None, b""]),
    "list_uuid": (pa.array([[_U1.bytes, None], None, []], pa.list_(pa.binary(16))).cast(pa.list_(pa.uuid())),
                  ("nested", None, ()), [[_U1, None], None, []]),
    "struct_uuid_bool8": (pa.StructArray.from_arrays(
        [_ext(pa.uuid(), [_U2.bytes, None, _U1.bytes]), _ext(pa.bool8(), [0, 2, None])], ["id", "ok"],
        mask=pa.array([False, False, True])), ("nested", None, ()),
        [{"id": _U2, "ok": False}, {"id": None, "ok": True}, None]),
    "list_tensor": (pa.ListArray.from_arrays(pa.array([0, 2, 2, 3]), _ext(pa.fixed_shape_tensor(pa.uint8(), (2,)),
                                                                       [[1, 2], [3, 4], [5, 6]])),
                    ("list", "|u1", (-1, 2)), [np.array([[1, 2], [3, 4]], np.uint8), np.zeros((0, 2), np.uint8),
                                               np.array([[5, 6]], np.uint8)]),
}


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray) or isinstance(want, np.generic):
        return type(got) is type(want) and got.dtype == want.dtype and np.array_equal(got, want)
    return type(got) is type(want) and got == want


@pytest.mark.parametrize("name", list(CANONICAL))
def test_canonical_extension_types_are_served_as_documented(name: str) -> None:
    """Canonical extension types (pa.BaseExtensionType, not pa.ExtensionType; pyarrow reads Parquet UUID / JSON as
    arrow.uuid / arrow.json by default): a uuid as uuid.UUID, bool8 as bool, a fixed_shape_tensor as an array of its
    shape, json and opaque as their storage (README "What a sample holds")."""
    arr, (kind, dtype, shape), cells = CANONICAL[name]
    t = pa.table({"x": arr, "id": pa.array([0, 1, 2])})
    schema, skipped = infer_schema(t.schema)
    assert skipped == {}
    c = schema.columns[0]
    assert (c.kind, c.dtype, c.shape) == (kind, dtype, shape)
    assert c.arrow == str(arr.type)
    wire = Schema.from_json(json.loads(json.dumps(schema.to_json())))
    for part, want in ((t, cells), (t.slice(1), cells[1:])):
        for bb in (1, 1 << 20):
            blocks = encode_table(part, schema, bb)[0]
            assert_round_trip(part, wire, blocks)
            got = [r["x"] for r in decode_all(blocks, wire)]
            assert len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want)), (got, want)
    if "tensor" not in name:  # exactly pyarrow's as_py() (a tensor's as_py() is its flat list)
        assert [_plain_py(v) for v in got] == arr.slice(1).to_pylist()


def _plain_py(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v.item() if isinstance(v, np.generic) else v


def test_canonical_extension_types_in_a_schema_from_their_storage() -> None:
    """A cache whose schema was inferred when extension types were served as their storage keeps that form: its
    new shards are encoded as its old ones were (the schema is stored once per cache)."""
    t = pa.table({k: CANONICAL[k][0] for k in ("uuid", "bool8", "tensor", "tensor_0d")})
    old = Schema(tuple(column_for(pa.field(f.name, f.type.storage_type)) for f in t.schema))
    assert [(c.kind, c.dtype, c.shape) for c in old.columns] == [
        ("binary", None, ()), ("fixed", "|i1", ()), ("fixed", "<f4", (6,)), ("fixed", "|i1", (1,))]
    rows = decode_all(encode_table(t, old, 1 << 20)[0], old)
    assert [r["uuid"] for r in rows] == [_U1.bytes, None, _U2.bytes]
    assert [None if r["bool8"] is None else int(r["bool8"]) for r in rows] == [1, None, -3]
    assert rows[0]["tensor"].tolist() == list(range(6)) and rows[1]["tensor"] is None
    assert rows[2]["tensor_0d"].tolist() == [-1]


def test_pieces_are_the_block_and_view_the_table() -> None:
    """encode_table_pieces: joined, each block is encode_table's (checksum included); a fixed column's section is
    a view of the Arrow buffer, not a copy, so a sampler writes its staging file with no payload copy."""
    from samplecache.format.record import verify_block
    from samplecache_service.sampling.encoder import encode_table_pieces
    x = np.arange(64 * 1024, dtype=np.float32)
    t = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x), 1024), "y": pa.array(np.arange(64)),
                  "s": pa.array([None if i % 7 == 0 else f"s{i}" for i in range(64)])})
    schema, _ = infer_schema(t.schema)
    joined, rpb = encode_table(t, schema, 64 << 10)
    pieces, rpb2 = encode_table_pieces(t, schema, 64 << 10)
    assert rpb == rpb2 and len(joined) == len(pieces) > 1
    for block, parts in zip(joined, pieces):
        assert bytes(block) == b"".join(parts)
        assert verify_block(block) is None
    base = x.__array_interface__["data"][0]
    section = next(p for p in pieces[0] if len(p) == rpb * 1024 * 4)
    assert np.frombuffer(section, np.uint8).__array_interface__["data"][0] == base, "the section was copied"
