"""A corpus of Parquet files written by real writers (pyarrow, pandas, Polars, DuckDB, Hugging Face
``datasets``), read back cell by cell through the encoder and the decoder.

Every file is written under ``tmp_path``; each row group is read with ``pq.ParquetFile(path).read_row_group``,
its record schema inferred (no column may be skipped), encoded at several block sizes (1 byte: one row per
block), the blocks decoded with the schema after a JSON round trip (what the client gets), and every cell
compared with pyarrow's value of the same cell (``arrow_compare``: exact, in the documented forms).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import math
import random
import uuid
import wave
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import damage_data as dd
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from arrow_compare import assert_cells_equal, expected_cells

from samplecache.format.record import Column, Schema, decode_rows
from samplecache.reading.blocks.reader import CacheReader
from samplecache_service.remote.columns import infer_schema
from samplecache_service.sampling.encoder import encode_table

BLOCK_SIZES = (1, 700, 1 << 30)


# --- the check ------------------------------------------------------------------------------------


def assert_table_round_trips(table: pa.Table, where: str) -> Schema:
    """Infer, encode at every block size, decode with the schema as the client gets it, compare every cell."""
    schema, skipped = infer_schema(table.schema)
    assert skipped == {}, f"{where}: columns left out: {skipped}"
    assert schema.names == table.schema.names
    wire = Schema.from_json(json.loads(json.dumps(schema.to_json())))
    for bb in BLOCK_SIZES:
        blocks, rows_per_block = encode_table(table, schema, bb)
        if bb == 1:
            assert rows_per_block == 1 and len(blocks) == table.num_rows
        rows = [r for b in blocks for r in decode_rows(bytes(b), wire)]
        assert len(rows) == table.num_rows, where
        for c in schema.columns:
            assert_cells_equal([r[c.name] for r in rows], table.column(c.name),
                               f"{where}, block_bytes={bb}, column {c.name} ({c.arrow})")
    return schema


def assert_file_round_trips(path: Path, min_row_groups: int = 2, **read_options: Any) -> dict[str, Column]:
    """Every row group of a file; returns the record columns (of the last row group) by name."""
    pf = pq.ParquetFile(path, **read_options)
    assert pf.num_row_groups >= min_row_groups, f"{path.name}: {pf.num_row_groups} row groups"
    schema = None
    for g in range(pf.num_row_groups):
        table = pf.read_row_group(g)
        assert table.num_rows > 0
        schema = assert_table_round_trips(table, f"{path.name} row group {g}")
    assert schema is not None
    return {c.name: c for c in schema.columns}


def _kinds(cols: dict[str, Column]) -> dict[str, str]:
    return {name: c.kind for name, c in cols.items()}


# --- pyarrow: every type ------------------------------------------------------------------------------

TZ_TS = [("s", "UTC"), ("ms", "America/New_York"), ("us", "+05:30"), ("ns", "Asia/Tokyo")]
# temporal values as integers in each unit, kept within +-4e9 s so INT96 (nanoseconds) can hold them
_SPAN = {"s": 4 * 10**9, "ms": 4 * 10**12, "us": 4 * 10**15, "ns": 4 * 10**18}
_DAY = {"s": 86400, "ms": 86400 * 10**3, "us": 86400 * 10**6, "ns": 86400 * 10**9}


def _pyarrow_columns(rng: random.Random) -> list[tuple[str, pa.DataType, Callable[[], Any]]]:
    """(name, Arrow type, generator of one non-null cell). Temporal leaves are generated as integers
    and cast; inner nulls come from ``opt``."""

    def opt(v: Any, p: float = 0.15) -> Any:
        return None if rng.random() < p else v

    def ints(bits: int, signed: bool) -> Callable[[], int]:
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        return lambda: rng.choice([lo, hi, 0, 1, rng.randint(lo, hi), rng.randint(lo, hi)])

    def floats(subnormal: float) -> Callable[[], float]:
        return lambda: rng.choice([math.nan, math.inf, -math.inf, -0.0, 0.0, subnormal,
                                   rng.gauss(0, 1e3), rng.gauss(0, 1), rng.uniform(-1, 1)])

    def text(alphabet: str = "ab éßΩж中文🙂\u0301") -> Callable[[], str]:
        return lambda: "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 3, 7, 20])))

    def blob(n: int | None = None) -> Callable[[], bytes]:
        return lambda: bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 5, 33]) if n is None else n))

    def span(unit: str) -> Callable[[], int]:
        return lambda: rng.randint(-_SPAN[unit], _SPAN[unit])

    def tod(unit: str) -> Callable[[], int]:  # time of day
        return lambda: rng.choice([0, _DAY[unit] - 1, rng.randrange(_DAY[unit])])

    def days() -> int:
        return rng.choice([0, -1, rng.randint(-700_000, 2_900_000)])

    def dec(precision: int, scale: int) -> Callable[[], Decimal]:
        def gen() -> Decimal:
            digits = rng.choice([0, 1, precision, rng.randint(0, precision)])
            mag = rng.randrange(10 ** digits) if digits else 0
            return Decimal(f"{rng.choice(['', '-'])}{mag}E-{scale}")  # exponent -scale, as Arrow gives it
        return gen

    def many(gen: Callable[[], Any], lens: tuple[int, ...] = (0, 1, 2, 5), p: float = 0.15) -> Callable[[], list]:
        return lambda: [opt(gen(), p) for _ in range(rng.choice(lens))]

    def fixed(gen: Callable[[], Any], k: int, p: float = 0.1) -> Callable[[], list]:
        return lambda: [opt(gen(), p) for _ in range(k)]

    def rect() -> list:  # a rectangular matrix, no null inside: the decoder's ndarray path
        r, c = rng.choice([(0, 0), (1, 3), (2, 2), (3, 1)])
        return [[rng.uniform(-9, 9) for _ in range(c)] for _ in range(r)]

    def mapping(key: Callable[[], Any], value: Callable[[], Any]) -> Callable[[], list]:
        def gen() -> list:
            keys: dict[Any, None] = {}
            for _ in range(rng.choice([0, 1, 3])):
                keys[key()] = None
            return [(k, opt(value())) for k in keys]
        return gen

    f32, f64 = floats(1e-45), floats(5e-324)
    cols: list[tuple[str, pa.DataType, Callable[[], Any]]] = []
    for bits in (8, 16, 32, 64):
        cols.append((f"i{bits}", getattr(pa, f"int{bits}")(), ints(bits, True)))
        cols.append((f"u{bits}", getattr(pa, f"uint{bits}")(), ints(bits, False)))
    cols += [
        ("f16", pa.float16(), floats(6e-8)),
        ("f32", pa.float32(), f32),
        ("f64", pa.float64(), f64),
        ("flag", pa.bool_(), lambda: rng.random() < 0.5),
        ("text", pa.string(), text()),
        ("large_text", pa.large_string(), text()),
        ("view_text", pa.string_view(), text()),
        ("bin", pa.binary(), blob()),
        ("large_bin", pa.large_binary(), blob()),
        ("view_bin", pa.binary_view(), blob()),
        ("fsb", pa.binary(5), blob(5)),
        ("date32", pa.date32(), days),
        ("date64", pa.date64(), lambda: days() * 86_400_000),  # Parquet stores dates as days
        ("time32_s", pa.time32("s"), tod("s")),
        ("time32_ms", pa.time32("ms"), tod("ms")),
        ("time64_us", pa.time64("us"), tod("us")),
        ("time64_ns", pa.time64("ns"), tod("ns")),
    ]
    for unit in ("s", "ms", "us", "ns"):
        cols.append((f"ts_{unit}", pa.timestamp(unit), span(unit)))
    for unit, tz in TZ_TS:
        cols.append((f"ts_{unit}_tz", pa.timestamp(unit, tz=tz), span(unit)))
    for unit in ("s", "ms", "us", "ns"):
        cols.append((f"dur_{unit}", pa.duration(unit), span(unit)))
    cols += [
        ("dec32", pa.decimal32(7, 2), dec(7, 2)),
        ("dec64", pa.decimal64(15, 3), dec(15, 3)),
        ("dec128", pa.decimal128(38, 9), dec(38, 9)),
        ("dec128_int", pa.decimal128(5, 0), dec(5, 0)),
        ("dec256", pa.decimal256(76, 20), dec(76, 20)),
        ("null", pa.null(), lambda: None),
        ("dict_text", pa.dictionary(pa.int8(), pa.string()), lambda: rng.choice(["cat", "dog", "", "中文"])),
        ("dict_int", pa.dictionary(pa.int32(), pa.int64()), lambda: rng.choice([7, -7, 1 << 40])),
        # lists
        ("l_i32", pa.list_(pa.int32()), many(ints(32, True))),
        ("l_u64", pa.list_(pa.uint64()), many(ints(64, False))),
        ("l_f16", pa.list_(pa.float16()), many(floats(6e-8))),
        ("ll_i64", pa.list_(pa.list_(pa.int64())), many(many(ints(64, True)))),
        ("lll_f32", pa.list_(pa.list_(pa.list_(pa.float32()))), many(many(many(f32, (0, 2)), (1, 2)), (0, 2))),
        ("large_l_f64", pa.large_list(pa.float64()), many(f64)),
        ("fsl_f32", pa.list_(pa.float32(), 3), fixed(f32, 3)),
        ("fsl_fsl_i16", pa.list_(pa.list_(pa.int16(), 2), 2), fixed(fixed(ints(16, True), 2), 2)),
        ("l_fsl_f64", pa.list_(pa.list_(pa.float64(), 2)), many(fixed(f64, 2))),
        ("fsl_l_u8", pa.list_(pa.list_(pa.uint8()), 2), fixed(many(ints(8, False)), 2)),
        ("rect_f32", pa.list_(pa.list_(pa.float32())), rect),
        ("large_rect_i8", pa.large_list(pa.list_(pa.int8(), 4)),
         lambda: [[rng.randint(-128, 127) for _ in range(4)] for _ in range(rng.choice([0, 1, 3]))]),
        ("l_bool", pa.list_(pa.bool_()), many(lambda: rng.random() < 0.5)),
        ("l_ts_tz", pa.list_(pa.timestamp("ms", tz="UTC")), many(span("ms"))),
        ("fsl_ts", pa.list_(pa.timestamp("ns"), 2), fixed(span("ns"), 2)),
        ("l_date", pa.list_(pa.date32()), many(days)),
        ("l_time", pa.list_(pa.time64("ns")), many(tod("ns"))),
        ("l_dur", pa.large_list(pa.duration("s")), many(span("s"))),
        ("l_text", pa.list_(pa.string()), many(text())),
        ("ll_text", pa.list_(pa.list_(pa.string())), many(many(text()))),
        ("l_bin", pa.list_(pa.binary()), many(blob())),
        ("l_fsb", pa.list_(pa.binary(3)), many(blob(3))),
        ("l_dec", pa.list_(pa.decimal128(10, 3)), many(dec(10, 3))),
        ("l_dec256", pa.large_list(pa.decimal256(50, 0)), many(dec(50, 0))),
        ("l_struct", pa.list_(pa.struct([("a", pa.int32()), ("b", pa.string())])),
         many(lambda: {"a": opt(rng.randint(-9, 9)), "b": opt(text()())})),
        ("l_null", pa.list_(pa.null()), lambda: [None] * rng.choice([0, 2])),
        # structs
        ("st", pa.struct([("a", pa.int64()), ("b", pa.string()),
                          ("inner", pa.struct([("x", pa.float64()), ("y", pa.list_(pa.int8())),
                                               ("when", pa.timestamp("us", tz="Europe/Paris"))])),
                          ("m", pa.map_(pa.string(), pa.int32()))]),
         lambda: {"a": opt(ints(64, True)()), "b": opt(text()()),
                  "inner": opt({"x": opt(f64()), "y": opt(many(ints(8, True))()), "when": opt(span("us")())}),
                  "m": opt(mapping(text("xyz"), ints(32, True))())}),
        ("st_null_field", pa.struct([("z", pa.null()), ("k", pa.int8())]), lambda: {"z": None, "k": opt(5)}),
        ("st_fsl", pa.struct([("v", pa.list_(pa.float32(), 2)), ("d", pa.decimal128(9, 4))]),
         lambda: {"v": opt(fixed(f32, 2)()), "d": opt(dec(9, 4)())}),
        # maps
        ("map_si", pa.map_(pa.string(), pa.int32()), mapping(text("abcdef"), ints(32, True))),
        ("map_sl", pa.map_(pa.string(), pa.list_(pa.float32())), mapping(text("abcdef"), many(f32))),
        ("map_is", pa.map_(pa.int64(), pa.struct([("p", pa.float64()), ("q", pa.binary())])),
         mapping(ints(64, True), lambda: {"p": opt(f64()), "q": opt(blob()())})),
        ("map_dt", pa.map_(pa.date32(), pa.timestamp("ns")), mapping(days, span("ns"))),
    ]
    return cols


def _with_int_leaves(t: pa.DataType) -> pa.DataType:
    """``t`` with temporal leaves as the integers they are generated as."""
    if pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        return pa.int32() if t.bit_width == 32 else pa.int64()
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_with_int_leaves(t.value_type), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(_with_int_leaves(t.value_type))
    if pa.types.is_list(t):
        return pa.list_(_with_int_leaves(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(_with_int_leaves(t.key_type), _with_int_leaves(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([(t.field(i).name, _with_int_leaves(t.field(i).type)) for i in range(t.num_fields)])
    return t


def make_all_types_table(n: int, seed: int) -> pa.Table:
    """Every Arrow type Parquet stores, with nulls at every level (top level, elements, inner lists,
    struct fields, map values); the first rows are null / empty / extreme on purpose."""
    rng = random.Random(seed)
    arrays = {}
    for name, typ, gen in _pyarrow_columns(rng):
        values = [None if (i == 1 or rng.random() < 0.15) else gen() for i in range(n)]
        if pa.types.is_dictionary(typ):
            arr = pa.array(values, typ.value_type).dictionary_encode().cast(typ)
        elif pa.types.is_null(typ):
            arr = pa.nulls(n)
        else:
            base = _with_int_leaves(typ)
            arr = pa.array(values, base)
            if base != typ:
                arr = arr.cast(typ)
        assert arr.type == typ, name
        arrays[name] = arr
    return pa.table(arrays)


# One row group is 15 rows, so a file of 45 rows has 3; small pages put several pages in a column chunk.
WRITE_CONFIGS: dict[str, dict[str, Any]] = {
    "v1-dict-snappy": dict(data_page_version="1.0", use_dictionary=True, compression="snappy"),
    "v2-dict-zstd": dict(data_page_version="2.0", use_dictionary=True, compression="zstd", compression_level=7),
    "v1-plain-none": dict(data_page_version="1.0", use_dictionary=False, compression="none"),
    "v2-plain-gzip": dict(data_page_version="2.0", use_dictionary=False, compression="gzip",
                          write_page_index=True, write_page_checksum=True),
    "v1-dict-brotli": dict(data_page_version="1.0", use_dictionary=True, compression="brotli",
                           max_rows_per_page=4),
    "v2-plain-lz4": dict(data_page_version="2.0", use_dictionary=False, compression="lz4"),
    "v1-legacy-lists": dict(use_compliant_nested_type=False, compression="snappy"),
    "v2-legacy-lists": dict(use_compliant_nested_type=False, data_page_version="2.0", use_dictionary=False),
    "int96-timestamps": dict(use_deprecated_int96_timestamps=True),
    "format-2.4": dict(version="2.4", coerce_timestamps="us", allow_truncated_timestamps=True),
    "format-1.0": dict(version="1.0", coerce_timestamps="us", allow_truncated_timestamps=True),
    "no-arrow-schema": dict(store_schema=False),  # read back from the Parquet logical types alone
}


def _write(table: pa.Table, path: Path, **options: Any) -> Path:
    pq.write_table(table, path, row_group_size=15, data_page_size=512, **options)
    return path


@pytest.fixture(scope="module")
def all_types() -> pa.Table:
    return make_all_types_table(45, seed=7)


@pytest.mark.parametrize("config", list(WRITE_CONFIGS))
def test_pyarrow_every_type(tmp_path: Path, all_types: pa.Table, config: str) -> None:
    path = _write(all_types, tmp_path / f"{config}.parquet", **WRITE_CONFIGS[config])
    cols = assert_file_round_trips(path, min_row_groups=3)
    assert set(cols) == set(all_types.column_names)
    # the file is what the config says
    options = WRITE_CONFIGS[config]
    meta = pq.ParquetFile(path).metadata
    codec = options.get("compression", "snappy").upper()
    assert meta.row_group(0).column(0).compression == ("UNCOMPRESSED" if codec == "NONE" else codec)
    element = pq.ParquetFile(path).schema.column(all_types.schema.get_field_index("l_i32")).path
    assert element == ("l_i32.list.item" if "use_compliant_nested_type" in options else "l_i32.list.element")


def test_pyarrow_every_type_in_memory(all_types: pa.Table) -> None:
    """The same table without Parquet (date64 stays date64); it has nulls at every level."""
    import pyarrow.compute as pc

    assert all(all_types.column(k).null_count > 0 for k in all_types.column_names)
    assert pc.list_flatten(all_types.column("l_i32")).null_count > 0  # list elements
    assert pc.list_flatten(pc.list_flatten(all_types.column("ll_i64"))).null_count > 0  # inner list elements
    assert pc.list_flatten(all_types.column("ll_i64")).null_count > 0  # inner lists
    assert pc.struct_field(all_types.column("st"), [0]).null_count > all_types.column("st").null_count
    assert pc.struct_field(all_types.column("st"), [2, 1]).null_count > 0  # struct in struct
    assert all_types.column("map_si").combine_chunks().items.null_count > 0  # map values
    assert all_types.column("fsl_f32").combine_chunks().flatten().null_count > 0  # fixed-size list elements
    assert_table_round_trips(all_types, "in memory")
    assert_table_round_trips(all_types.slice(7, 30), "in memory, sliced")


def test_pyarrow_schema_mapping(tmp_path: Path, all_types: pa.Table) -> None:
    """What each Parquet-read type becomes in the record schema."""
    path = _write(all_types, tmp_path / "t.parquet")
    schema, _ = infer_schema(pq.ParquetFile(path).read_row_group(0).schema)
    c = {col.name: col for col in schema.columns}
    for bits in (8, 16, 32, 64):
        assert (c[f"i{bits}"].kind, c[f"i{bits}"].dtype) == ("fixed", np.dtype(f"int{bits}").str)
        assert (c[f"u{bits}"].kind, c[f"u{bits}"].dtype) == ("fixed", np.dtype(f"uint{bits}").str)
    assert [c[k].dtype for k in ("f16", "f32", "f64", "flag")] == ["<f2", "<f4", "<f8", "|b1"]
    assert {k: c[k].kind for k in ("text", "large_text", "view_text", "dict_text")} == dict.fromkeys(
        ("text", "large_text", "view_text", "dict_text"), "string")
    assert {c[k].kind for k in ("bin", "large_bin", "view_bin", "fsb")} == {"binary"}
    # Parquet has no date64, time32[s] or timestamp[s]: pyarrow reads them back as date32, time32[ms] and
    # timestamp[ms] (the values are the same instants)
    read = pq.ParquetFile(path).schema_arrow
    assert [read.field(k).type for k in ("date64", "time32_s", "ts_s", "ts_s_tz")] == \
        [pa.date32(), pa.time32("ms"), pa.timestamp("ms"), pa.timestamp("ms", tz="UTC")]
    assert [c[k].dtype for k in ("date32", "date64", "time32_s", "time32_ms", "time64_us", "time64_ns")] == \
        ["<M8[D]", "<M8[D]", "<m8[ms]", "<m8[ms]", "<m8[us]", "<m8[ns]"]
    for unit in ("ms", "us", "ns"):
        assert (c[f"ts_{unit}"].dtype, c[f"ts_{unit}"].tz) == (f"<M8[{unit}]", None)
    for unit in ("s", "ms", "us", "ns"):
        assert c[f"dur_{unit}"].dtype == f"<m8[{unit}]"
    for unit, tz in TZ_TS:
        assert (c[f"ts_{unit}_tz"].dtype, c[f"ts_{unit}_tz"].tz) == (f"<M8[{'ms' if unit == 's' else unit}]", tz)
    assert (c["fsl_f32"].kind, c["fsl_f32"].shape) == ("fixed", (3,))
    assert (c["fsl_fsl_i16"].kind, c["fsl_fsl_i16"].shape) == ("fixed", (2, 2))
    assert (c["fsl_ts"].kind, c["fsl_ts"].dtype) == ("fixed", "<M8[ns]")
    assert (c["ll_i64"].kind, c["ll_i64"].shape) == ("list", (-1, -1))
    assert (c["l_fsl_f64"].kind, c["l_fsl_f64"].shape) == ("list", (-1, 2))
    assert (c["fsl_l_u8"].kind, c["fsl_l_u8"].shape) == ("list", (2, -1))
    assert (c["l_ts_tz"].dtype, c["l_ts_tz"].tz) == ("<M8[ms]", "UTC")
    for k in ("dec32", "dec64", "dec128", "dec256", "null", "l_text", "ll_text", "l_bin", "l_fsb", "l_dec",
              "l_struct", "l_null", "st", "st_null_field", "st_fsl", "map_si", "map_sl", "map_is", "map_dt"):
        assert c[k].kind == "nested", k
    assert c["dec256"].type == {"t": "decimal", "width": 32, "scale": 20}
    assert c["dec32"].type == {"t": "decimal", "width": 4, "scale": 2}
    assert c["map_dt"].type == {"t": "map", "key": {"t": "prim", "dtype": "<M8[D]"},
                                "value": {"t": "prim", "dtype": "<M8[ns]"}}
    assert c["st"].arrow == str(read.field("st").type)


def _encodings_for(table: pa.Table, style: str) -> dict[str, str]:
    """column_encoding for every leaf column, by its physical type; ``style`` "delta" or "split"."""
    buf = io.BytesIO()
    pq.write_table(table.slice(0, 1), buf)
    meta = pq.ParquetFile(io.BytesIO(buf.getvalue())).schema
    out = {}
    for i in range(len(meta)):
        col = meta.column(i)
        phys = col.physical_type
        if style == "delta":
            enc = {"INT32": "DELTA_BINARY_PACKED", "INT64": "DELTA_BINARY_PACKED",
                   "BYTE_ARRAY": "DELTA_LENGTH_BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY": "DELTA_BYTE_ARRAY",
                   "FLOAT": "BYTE_STREAM_SPLIT", "DOUBLE": "BYTE_STREAM_SPLIT", "BOOLEAN": "RLE"}.get(phys)
        else:
            enc = {"INT32": "BYTE_STREAM_SPLIT", "INT64": "BYTE_STREAM_SPLIT", "BYTE_ARRAY": "DELTA_BYTE_ARRAY",
                   "FIXED_LEN_BYTE_ARRAY": "BYTE_STREAM_SPLIT", "FLOAT": "BYTE_STREAM_SPLIT",
                   "DOUBLE": "BYTE_STREAM_SPLIT"}.get(phys)
        # pyarrow cannot read DELTA_(LENGTH_)BYTE_ARRAY pages into a dictionary array ("Not yet implemented:
        # DecodeArrow of DictAccumulator"): the dictionary column keeps its default encoding
        if enc and col.path != "dict_text":
            out[col.path] = enc
    return out


@pytest.mark.parametrize("style,page_version", [("delta", "1.0"), ("delta", "2.0"), ("split", "2.0")])
def test_pyarrow_column_encodings(tmp_path: Path, all_types: pa.Table, style: str, page_version: str) -> None:
    encodings = _encodings_for(all_types, style)
    path = _write(all_types, tmp_path / f"{style}.parquet", use_dictionary=False, column_encoding=encodings,
                  data_page_version=page_version, compression="zstd")
    md = pq.ParquetFile(path).metadata.row_group(0)
    used = {md.column(i).path_in_schema: set(md.column(i).encodings) for i in range(md.num_columns)}
    for p, enc in encodings.items():
        assert enc in used[p], (p, enc, used[p])
    assert len(encodings) > 60
    assert_file_round_trips(path, min_row_groups=3)


@pytest.mark.parametrize("read_options", [
    dict(binary_type=pa.binary_view(), list_type=pa.LargeListType),
    dict(binary_type=pa.large_binary(), list_type=pa.LargeListType),
    dict(read_dictionary=["text", "bin", "l_text.list.element"]),
], ids=["views", "large", "read-dictionary"])
def test_pyarrow_read_options(tmp_path: Path, all_types: pa.Table, read_options: dict) -> None:
    """The Arrow types a reader may choose for the same Parquet columns (views, large types, dictionaries)."""
    path = _write(all_types, tmp_path / "t.parquet", store_schema=False)
    assert_file_round_trips(path, min_row_groups=3, **read_options)


def test_pyarrow_multi_chunk_and_sliced_tables(tmp_path: Path, all_types: pa.Table) -> None:
    """A table of several chunks (the whole file), sliced across chunk boundaries."""
    path = _write(all_types, tmp_path / "t.parquet")
    table = pq.read_table(path)
    table = pa.concat_tables([table.slice(0, 20), table.slice(20)])
    assert table.column("st").num_chunks >= 2
    for start, length in ((0, 45), (13, 17), (19, 2), (44, 1)):
        assert_table_round_trips(table.slice(start, length), f"slice {start}+{length}")


def _canonical_extension_table(n: int, seed: int) -> tuple[pa.Table, dict[str, Any]]:
    """Every canonical extension type pyarrow knows, at the top level and nested, nulls included; and what each
    column is expected to decode to, where the writer's input says so (the uuids, the tensors as numpy wrote them)."""
    rng = random.Random(seed)
    ids = [uuid.UUID(int=rng.getrandbits(128)) if i % 3 else None for i in range(n)]
    tensors = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) - 7.5
    cube = np.arange(n * 24, dtype=np.int16).reshape(n, 2, 3, 4)
    flags = [None if i % 4 == 1 else rng.choice([0, 1, -1, 127]) for i in range(n)]
    docs = [None if i % 5 == 2 else json.dumps({"k": i, "s": "中"}, ensure_ascii=False) for i in range(n)]

    def ext(t: pa.DataType, values: list[Any]) -> pa.Array:
        return pa.ExtensionArray.from_storage(t, pa.array(values, t.storage_type))

    table = pa.table({
        "uuid": ext(pa.uuid(), [u.bytes if u else None for u in ids]),
        "json": ext(pa.json_(), docs),
        "json_large": ext(pa.json_(pa.large_string()), docs),
        "bool8": ext(pa.bool8(), flags),
        "tensor": pa.FixedShapeTensorArray.from_numpy_ndarray(tensors),
        "tensor_named": pa.ExtensionArray.from_storage(
            pa.fixed_shape_tensor(pa.int16(), (2, 3, 4), dim_names=["c", "h", "w"]),
            pa.FixedShapeTensorArray.from_numpy_ndarray(cube).storage),
        "tensor_nulls": ext(pa.fixed_shape_tensor(pa.float64(), (2, 2)),
                            [None if i % 3 == 0 else [1.5, None if i % 2 else -0.0, math.inf, i] for i in range(n)]),
        "opaque": ext(pa.opaque(pa.binary(), "geometry", "postgis"), [None if i % 4 == 3 else bytes([i]) * i
                                                                        for i in range(n)]),
        "opaque_int": ext(pa.opaque(pa.int64(), "ticks", "vendor.example"), [i * 1000 for i in range(n)]),
        "list_uuid": pa.array([[u.bytes if u else None for u in ids[i:i + 2]] if i % 5 else None for i in range(n)],
                              pa.list_(pa.binary(16))).cast(pa.list_(pa.uuid())),
        "struct_ext": pa.StructArray.from_arrays(
            [ext(pa.uuid(), [u.bytes if u else None for u in ids]), ext(pa.bool8(), flags), ext(pa.json_(), docs)],
            ["id", "ok", "doc"]),
    })
    return table, {"uuid": ids, "json": docs, "bool8": [None if f is None else f != 0 for f in flags],
                   "tensor": list(tensors), "tensor_named": list(cube)}


def test_pyarrow_canonical_extension_types(tmp_path: Path) -> None:
    """The canonical extension types as pyarrow writes them to Parquet (in the file's Arrow schema) and reads
    them back: a uuid as uuid.UUID, bool8 as bool, json as its text, a fixed_shape_tensor as an ndarray of its
    shape, opaque as its storage's value; nested ones too."""
    table, want = _canonical_extension_table(40, seed=1)
    path = _write(table, tmp_path / "ext.parquet")
    read = pq.ParquetFile(path).schema_arrow
    assert {f.name: f.type for f in read} == {f.name: f.type for f in table.schema}  # pyarrow reads them back
    cols = assert_file_round_trips(path, min_row_groups=3)
    assert {k: (c.kind, c.dtype, c.shape) for k, c in cols.items()} == {
        "uuid": ("binary", None, ()), "json": ("string", None, ()), "json_large": ("string", None, ()),
        "bool8": ("fixed", "|b1", ()), "tensor": ("fixed", "<f4", (2, 3)),
        "tensor_named": ("fixed", "<i2", (2, 3, 4)), "tensor_nulls": ("fixed", "<f8", (2, 2)),
        "opaque": ("binary", None, ()), "opaque_int": ("fixed", "<i8", ()), "list_uuid": ("nested", None, ()),
        "struct_ext": ("nested", None, ())}
    assert cols["tensor_named"].arrow == str(read.field("tensor_named").type)  # its dim_names are in /v1/schema
    got = decoded_columns(path)
    assert got["uuid"] == want["uuid"] and all(type(u) is uuid.UUID for u in got["uuid"] if u is not None)
    assert got["json"] == want["json"] and got["json_large"] == want["json"]
    assert [None if v is None else bool(v) for v in got["bool8"]] == want["bool8"]
    for k in ("tensor", "tensor_named"):  # the arrays numpy wrote, exactly
        assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got[k], want[k], strict=True)), k
    # exactly pyarrow's as_py() where it is the form (a tensor's as_py() is its flat list)
    as_py = pq.read_table(path)
    for k in ("uuid", "json", "opaque", "list_uuid", "struct_ext"):
        assert got[k] == as_py.column(k).to_pylist(), k
    assert [None if v is None else v.item() for v in got["bool8"]] == as_py.column("bool8").to_pylist()
    assert got["struct_ext"][1] == {"id": want["uuid"][1], "ok": None, "doc": want["json"][1]}


def _masked(cell: np.ndarray, valid: np.ndarray) -> Any:
    """A batch's array cell with its ``__valid`` mask as ``as_py()`` has it: None where masked."""
    if cell.ndim == 0:
        return cell[()] if valid else None
    if not valid.any():
        return None
    return [_masked(c, v) if c.ndim else (c.item() if v else None) for c, v in zip(cell, valid)]


@pytest.mark.parametrize("masks", [True, False], ids=["masks", "lists"])
def test_canonical_extension_types_in_a_batch(tmp_path: Path, masks: bool) -> None:
    """The same columns gathered into batches from a real LMDB cache (CacheReader.batch, what SampleCacheLoader and
    batch_size= use): a uuid column as a list of uuid.UUID, json as a list of str, bool8 as a bool array (with
    ``masks``: False under nulls plus ``<name>__valid``; without: a list when nulls are in the batch), a
    fixed_shape_tensor as one (B, *shape) array."""
    table, want = _canonical_extension_table(40, seed=2)
    # a plain bool column with nulls too: its masked batch once raised (numpy would not cast 0 to bool)
    table = table.append_column("flag", pa.array([None if i % 4 == 1 else i % 3 == 0 for i in range(40)]))
    schema, skipped = infer_schema(table.schema)
    assert skipped == {}
    staging = tmp_path / "staging"
    staging.mkdir()
    cache = dd.Cache(tmp_path / "lmdb")
    try:
        path, _, rpb = dd.stage(staging, "s0", table, schema, block_bytes=2000)
        shard = cache.writer.ingest(path).result().shard
        assert shard is not None and rpb < table.num_rows  # several blocks
    finally:
        cache.close()
    rows = np.array([7, 0, 39, 1, 12, 5, 33, 8], np.int64)  # across blocks, out of order
    n = len(rows)
    got = CacheReader(str(tmp_path / "lmdb"), dd.MAP_SIZE, schema).batch(
        np.full(n, shard.id, np.int64), np.full(n, rpb, np.int64), rows, list(range(len(schema.columns))),
        masks=masks)
    picked = rows.tolist()
    assert got["uuid"] == [want["uuid"][r] for r in picked]
    assert all(type(u) is uuid.UUID for u in got["uuid"] if u is not None)
    assert got["json"] == [want["json"][r] for r in picked]
    flags = [want["bool8"][r] for r in picked]
    assert None in flags
    if masks:
        assert got["bool8"].dtype == np.bool_ and got["bool8__valid"].tolist() == [f is not None for f in flags]
        assert got["bool8"].tolist() == [bool(f) for f in flags]
    else:
        assert [None if v is None else bool(v) for v in got["bool8"]] == flags
    tensors = got["tensor"]
    assert tensors.dtype == np.float32 and np.array_equal(tensors, np.stack([want["tensor"][r] for r in picked]))
    assert got["tensor_named"].shape == (n, 2, 3, 4)
    for name in schema.names:  # every column, cell by cell, as pyarrow reads it
        cells = got[name]
        if isinstance(cells, np.ndarray):
            valid = got.get(name + "__valid")
            cells = [cells[j] if valid is None or valid[j].all() else _masked(cells[j], valid[j]) for j in range(n)]
        assert_cells_equal(cells, table.column(name).take(pa.array(picked)), f"batch, column {name}")


# --- the comparator itself ----------------------------------------------------------------------------


def test_arrow_compare_catches_wrong_forms() -> None:
    ts = pa.array([0, None], pa.int64()).cast(pa.timestamp("ms"))
    assert_cells_equal([np.datetime64(0, "ms"), None], ts, "ok")
    assert expected_cells(ts)[0].dtype == np.dtype("<M8[ms]")
    for bad in ([np.datetime64(0, "us"), None], [np.int64(0), None], [np.datetime64(0, "ms"), np.datetime64(0, "ms")]):
        with pytest.raises(AssertionError):
            assert_cells_equal(bad, ts, "bad")
    dec = pa.array([Decimal("1.50")], pa.decimal128(5, 2))
    assert_cells_equal([Decimal("1.50")], dec, "ok")
    with pytest.raises(AssertionError):
        assert_cells_equal([Decimal("1.5")], dec, "exponent")
    lst = pa.array([[1.0, 2.0], [1.0, None], [[1.0]][0]], pa.list_(pa.float32()))
    assert_cells_equal([np.array([1, 2], np.float32), [1.0, None], np.array([1], np.float32)], lst, "ok")
    for bad in ([[1.0, 2.0], [1.0, None], np.array([1], np.float32)],              # list where an array is due
                [np.array([1, 2], np.float64), [1.0, None], np.array([1], np.float32)],  # leaf dtype
                [np.array([1, 2], np.float32), [np.float32(1), None], np.array([1], np.float32)]):  # numpy leaf
        with pytest.raises(AssertionError):
            assert_cells_equal(bad, lst, "bad")
    nan = pa.array([math.nan, -0.0], pa.float64())
    assert_cells_equal([np.float64("nan"), np.float64(-0.0)], nan, "ok")
    with pytest.raises(AssertionError):
        assert_cells_equal([np.float64("nan"), np.float64(0.0)], nan, "sign of zero")
    m = pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int8()))
    assert_cells_equal([[("a", 1)]], m, "ok")
    with pytest.raises(AssertionError):
        assert_cells_equal([{"a": 1}], m, "map as dict")
    d = pa.array(["x", None, "x"]).dictionary_encode()
    assert_cells_equal(["x", None, "x"], d, "dictionary values")


# --- random nested types -----------------------------------------------------------------------------

_RANDOM_LEAVES = [pa.int8(), pa.uint16(), pa.int32(), pa.uint64(), pa.float16(), pa.float32(), pa.float64(),
                  pa.bool_(), pa.date32(), pa.time32("s"), pa.time64("ns"), pa.timestamp("ms", tz="UTC"),
                  pa.timestamp("ns"), pa.duration("us"), pa.string(), pa.large_binary(), pa.binary(3),
                  pa.decimal128(9, 2), pa.decimal256(40, 5), pa.null()]


def _random_type(rng: random.Random, depth: int = 0) -> pa.DataType:
    if depth >= 3 or rng.random() < 0.4:
        return rng.choice(_RANDOM_LEAVES)
    kind = rng.choice(["list", "large_list", "fixed", "struct", "map"])
    if kind == "list":
        return pa.list_(_random_type(rng, depth + 1))
    if kind == "large_list":
        return pa.large_list(_random_type(rng, depth + 1))
    if kind == "fixed":
        return pa.list_(_random_type(rng, depth + 1), rng.choice([1, 2, 3]))
    if kind == "struct":
        return pa.struct([(f"f{i}", _random_type(rng, depth + 1)) for i in range(rng.choice([1, 2, 3]))])
    return pa.map_(rng.choice([pa.string(), pa.int32()]), _random_type(rng, depth + 1))


def _random_value(rng: random.Random, t: pa.DataType, p_null: float) -> Any:
    """A value of ``t`` with temporal leaves as integers (cast afterwards)."""
    if rng.random() < p_null or pa.types.is_null(t):
        return None
    if pa.types.is_boolean(t):
        return rng.random() < 0.5
    if pa.types.is_integer(t):
        bits = t.bit_width
        if pa.types.is_signed_integer(t):
            return rng.randint(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        return rng.randint(0, (1 << bits) - 1)
    if pa.types.is_floating(t):
        return rng.choice([0.5, -0.0, math.nan, 3.25, -1e3, math.inf])
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return rng.randint(0, 86399)
    if pa.types.is_time64(t):
        return rng.randint(0, 86399 * 10**9)
    if pa.types.is_temporal(t):
        return rng.randint(-10**12, 10**12)
    if pa.types.is_string(t):
        return rng.choice(["", "a", "中文", "xyz"])
    if pa.types.is_decimal(t):
        return Decimal(f"{rng.randint(-10**6, 10**6)}E-{t.scale}")
    if pa.types.is_fixed_size_binary(t):
        return bytes(rng.getrandbits(8) for _ in range(t.byte_width))
    if pa.types.is_large_binary(t):
        return rng.choice([b"", b"\x00", b"ab"])
    if pa.types.is_fixed_size_list(t):
        return [_random_value(rng, t.value_type, p_null) for _ in range(t.list_size)]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_random_value(rng, t.value_type, p_null) for _ in range(rng.choice([0, 1, 2, 3]))]
    if pa.types.is_struct(t):
        return {t.field(i).name: _random_value(rng, t.field(i).type, p_null) for i in range(t.num_fields)}
    assert pa.types.is_map(t)
    keys = {_random_value(rng, t.key_type, 0): None for _ in range(rng.choice([0, 1, 2]))}
    return [(k, _random_value(rng, t.item_type, p_null)) for k in keys]


@pytest.mark.parametrize("first_seed", [0, 40, 80, 120])
def test_random_nested_types_through_parquet(first_seed: int) -> None:
    """Random type trees (lists, fixed-size lists, structs, maps of every leaf), random nulls, written with
    random pyarrow settings, one random row group read back, randomly sliced."""
    tried = 0
    for seed in range(first_seed, first_seed + 40):
        rng = random.Random(seed)
        n = rng.randint(1, 25)
        p_null = rng.choice([0.0, 0.0, 0.1, 0.4])
        arrays = {}
        for i in range(rng.randint(1, 4)):
            t = _random_type(rng)
            values = [_random_value(rng, t, p_null) for _ in range(n)]
            arrays[f"c{i}"] = pa.nulls(n) if pa.types.is_null(t) else pa.array(values, _with_int_leaves(t)).cast(t)
        try:
            table = pa.table(arrays)
            table.validate(full=True)
        except pa.ArrowInvalid:
            continue  # pyarrow builds a few of these cast trees wrong (fixed-size lists under nulls); not ours
        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=rng.choice([3, 7, 100]), use_dictionary=rng.random() < 0.5,
                       data_page_version=rng.choice(["1.0", "2.0"]), store_schema=rng.random() < 0.7)
        pf = pq.ParquetFile(io.BytesIO(buf.getvalue()))
        table = pf.read_row_group(rng.randrange(pf.num_row_groups))
        if table.num_rows > 2 and rng.random() < 0.5:
            start = rng.randrange(table.num_rows)
            table = table.slice(start, rng.randint(1, table.num_rows - start))
        assert_table_round_trips(table, f"seed {seed} ({', '.join(str(f.type) for f in table.schema)})")
        tried += 1
    assert tried >= 35


# --- list views ---------------------------------------------------------------------------------------


def test_pyarrow_list_views(tmp_path: Path) -> None:
    """list_view / large_list_view columns, as pyarrow writes and reads them back from Parquet."""
    rng = random.Random(3)
    n = 20
    ints = [None if i % 7 == 1 else [rng.randint(-9, 9) for _ in range(rng.choice([0, 1, 2, 3]))] for i in range(n)]
    words = [None if i % 5 == 2 else [rng.choice(["a", "", "中", None]) for _ in range(rng.choice([0, 2]))]
             for i in range(n)]
    table = pa.table({"v_i16": pa.array(ints, pa.list_view(pa.int16())),
                      "lv_f32": pa.array(ints, pa.large_list_view(pa.float32())),
                      "v_text": pa.array(words, pa.list_view(pa.string()))})
    path = tmp_path / "views.parquet"
    pq.write_table(table, path, row_group_size=10)
    assert pq.ParquetFile(path).schema_arrow.field("v_i16").type == pa.list_view(pa.field("element", pa.int16()))
    assert_file_round_trips(path)


# --- pandas -------------------------------------------------------------------------------------------


def decoded_columns(path: Path, **read_options: Any) -> dict[str, list[Any]]:
    """Every decoded cell of a file, by column (all row groups, one block each)."""
    pf = pq.ParquetFile(path, **read_options)
    out: dict[str, list[Any]] = {}
    for g in range(pf.num_row_groups):
        table = pf.read_row_group(g)
        schema, _ = infer_schema(table.schema)
        for block in encode_table(table, schema, 1 << 30)[0]:
            for row in decode_rows(block, schema):
                for k, v in row.items():
                    out.setdefault(k, []).append(v)
    return out


def test_pandas_to_parquet(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    n = 10
    df = pd.DataFrame({
        "i": np.arange(n, dtype=np.int64),
        "f": [1.5, np.nan, None, 2.0, -0.0, np.inf, 3.0, 4.0, 5.0, -np.inf],
        "obj_str": ["a", None, "ß", "", np.nan, "x", "y", "z", "中文", "w"],
        "obj_str_explicit": pd.Series(["a", None, "b", "c", "d", "e", "f", "g", "h", "i"], dtype=object),
        "nullable_int": pd.array([1, None, 3, pd.NA, 5, 6, 7, 8, 9, -(1 << 63)], dtype="Int64"),
        "nullable_uint8": pd.array([1, None, 255, 0, 5, 6, 7, 8, 9, 10], dtype="UInt8"),
        "nullable_bool": pd.array([True, None, False, pd.NA, True, True, False, True, False, True], dtype="boolean"),
        "nullable_f32": pd.array([1.5, None, 3, pd.NA, 5, 6, 7, 8, 9, 0.1], dtype="Float32"),
        "cat": pd.Categorical(["a", "b", None, "a", "c", "c", "b", "a", None, "b"]),
        "cat_int": pd.Categorical([1, 2, None, 1, 3, 3, 2, 1, None, 2]),
        "ts_tz": pd.date_range("2021-03-27", periods=n, freq="7h", tz="Europe/Berlin"),
        "ts_ns": pd.to_datetime(["2020-01-01", None, "1900-01-01 00:00:00.000000001", "2262-01-01", "1970-01-01",
                                 "2000-02-29", "2001-01-01", "2002-01-01", "2003-01-01", "1677-09-22"],
                                format="mixed").as_unit("ns"),
        "td": pd.to_timedelta([1, None, -5, 10**9, 0, 1, 2, 3, 4, 5], unit="s"),
        "dates": [dt.date(2020, 1, i + 1) if i % 3 else None for i in range(n)],
        "dec": [Decimal("1.25"), None, Decimal("-3.5"), Decimal("0"), None, Decimal("10.01"), Decimal("2"),
                Decimal("3"), Decimal("4"), Decimal("-99.99")],
        "bytes": [b"x", None, b"", b"\x00\xff", b"a", b"b", b"c", b"d", b"e", b"f"],
        "lists": [[1, 2], None, [], [3], [None, 4], [5], [6], [7], [8], [9, 10]],
        "nested_lists": [[[1.5], [2.5, 3.5]], None, [], [None], [[]], [[1.0, 2.0], [3.0, 4.0]], [[5.0]], [[6.0]],
                         [[7.0]], [[8.0]]],
        "dicts": [{"a": 1, "b": "x"}, None, {"a": None, "b": None}, {"a": 2, "b": "y"}, {"a": 3, "b": "z"},
                  {"a": 4, "b": "w"}, {"a": 5, "b": "v"}, {"a": 6, "b": "u"}, {"a": 7, "b": "t"}, {"a": 8, "b": "s"}],
        "arrow_list": pd.array([[1.5, 2.5], None, [], [1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [7.0]],
                               dtype=pd.ArrowDtype(pa.list_(pa.float32()))),
        "arrow_ts": pd.array([dt.datetime(2020, 1, 1, 1), None] * 5, dtype=pd.ArrowDtype(pa.timestamp("ms"))),
        # pandas' own Arrow extension types (stored as int64 / struct<left, right>)
        "period": pd.period_range("2020-01", periods=n, freq="M"),
        "interval": pd.interval_range(0, n),
    }, index=pd.Index([f"r{i}" for i in range(n)], name="key"))
    path = tmp_path / "pandas.parquet"
    df.to_parquet(path, row_group_size=4)
    cols = assert_file_round_trips(path, min_row_groups=3)
    assert set(cols) == set(df.columns) | {"key"}
    assert _kinds(cols)["cat"] == "string" and _kinds(cols)["key"] == "string"
    assert (cols["ts_tz"].dtype, cols["ts_tz"].tz) == (f"<M8[{df['ts_tz'].dt.unit}]", "Europe/Berlin")
    assert (cols["nullable_int"].kind, cols["nullable_int"].dtype) == ("fixed", "<i8")
    assert cols["dec"].kind == "nested" and cols["interval"].kind == "nested" and cols["period"].dtype == "<i8"
    got = decoded_columns(path)
    assert [None if v is None else int(v) for v in got["nullable_int"]] == \
        [1, None, 3, None, 5, 6, 7, 8, 9, -(1 << 63)]
    assert got["obj_str"][:5] == ["a", None, "ß", "", None]
    assert got["cat"] == ["a", "b", None, "a", "c", "c", "b", "a", None, "b"]
    assert got["ts_ns"][2] == np.datetime64("1900-01-01T00:00:00.000000001") and got["ts_ns"][1] is None
    assert got["dec"][2] == Decimal("-3.50") and got["dec"][1] is None
    assert got["dicts"][2] == {"a": None, "b": None} and got["dicts"][1] is None
    assert got["lists"][4] == [None, 4] and got["lists"][0].tolist() == [1, 2]
    assert got["nested_lists"][0] == [[1.5], [2.5, 3.5]] and got["nested_lists"][5].shape == (2, 2)


# --- Polars -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["zstd", "snappy", "uncompressed"])
def test_polars_write_parquet(tmp_path: Path, compression: str) -> None:
    pl = pytest.importorskip("polars")
    n = 10
    times = [dt.datetime(2021, 1, 1, 12), None, dt.datetime(1900, 1, 1), dt.datetime(2100, 1, 1, 0, 0, 1)]
    times += [dt.datetime(2000, 1, 1, i) for i in range(n - len(times))]
    df = pl.DataFrame({
        "i8": pl.Series([1, None, -128, 127] + list(range(n - 4)), dtype=pl.Int8),
        "u64": pl.Series([2**64 - 1, None, 0] + list(range(n - 3)), dtype=pl.UInt64),
        # pl.Int128 is left out: Polars writes it as a 128-bit Parquet integer that pyarrow cannot read
        # ("Integers with more than 64 bits not implemented")
        "f16": pl.Series([1.5, None, float("nan"), -0.0] + [float(i) for i in range(n - 4)], dtype=pl.Float16),
        "f32": pl.Series([1.5, None, float("nan"), -0.0] + [0.1 * i for i in range(n - 4)], dtype=pl.Float32),
        "b": [True, None, False] + [i % 2 == 0 for i in range(n - 3)],
        "s": ["a", None, "中文", ""] + [f"s{i}" for i in range(n - 4)],
        "bin": [b"a", None, b"", b"\x00"] + [bytes([i]) for i in range(n - 4)],
        "date": [dt.date(2020, 1, 1), None, dt.date(1, 1, 1), dt.date(9999, 12, 31)]
        + [dt.date(2000, 1, i + 1) for i in range(n - 4)],
        "dtz": pl.Series(times, dtype=pl.Datetime("us", "Europe/Berlin")),
        "dns": pl.Series(times, dtype=pl.Datetime("ns")),
        "dms": pl.Series(times, dtype=pl.Datetime("ms", "UTC")),
        "dur": pl.Series([dt.timedelta(seconds=1), None, dt.timedelta(days=-1)]
                         + [dt.timedelta(microseconds=i) for i in range(n - 3)], dtype=pl.Duration("us")),
        "dur_ns": pl.Series([1, None, -5] + list(range(n - 3)), dtype=pl.Int64).cast(pl.Duration("ns")),
        "time": [dt.time(1, 2, 3), None, dt.time(0), dt.time(23, 59, 59, 999999)]
        + [dt.time(i) for i in range(n - 4)],
        "lst": [[1, None], None, [], [2]] + [[i, i] for i in range(n - 4)],
        "lst2": [[[1.0], [2.0, 3.0]], None, [], [None], [[]]] + [[[float(i)] * 2] * 2 for i in range(n - 5)],
        "lst_str": [["a", None], None, [], ["b"]] + [[str(i)] for i in range(n - 4)],
        "arr": pl.Series([[1.0, 2.0], None, [3.0, None]] + [[float(i), 0.5] for i in range(n - 3)],
                         dtype=pl.Array(pl.Float32, 2)),
        "arr2": pl.Series([[[i, i + 1, i + 2], [0, 0, 0]] if i != 1 else None for i in range(n)],
                          dtype=pl.Array(pl.Int16, (2, 3))),
        "st": [{"a": 1, "b": "x", "c": [1.5]}, None, {"a": None, "b": None, "c": None}]
        + [{"a": i, "b": str(i), "c": []} for i in range(n - 3)],
        "cat": pl.Series(["a", "b", None, "a"] + ["c"] * (n - 4), dtype=pl.Categorical),
        "enum": pl.Series(["lo", "hi", None] + ["lo"] * (n - 3), dtype=pl.Enum(["lo", "hi"])),
        "dec": pl.Series([Decimal("1.2500"), None, Decimal("-3.5"), Decimal("12345678901234.5678")]
                         + [Decimal(i) for i in range(n - 4)], dtype=pl.Decimal(20, 4)),
        "null": pl.Series([None] * n, dtype=pl.Null),
    })
    path = tmp_path / f"polars-{compression}.parquet"
    df.write_parquet(path, row_group_size=4, compression=compression)
    cols = assert_file_round_trips(path, min_row_groups=3)
    assert set(cols) == set(df.columns)
    assert (cols["dtz"].dtype, cols["dtz"].tz) == ("<M8[us]", "Europe/Berlin")
    assert (cols["dms"].dtype, cols["dms"].tz) == ("<M8[ms]", "UTC")
    assert (cols["arr"].kind, cols["arr"].shape) == ("fixed", (2,))
    assert (cols["arr2"].kind, cols["arr2"].shape, cols["arr2"].dtype) == ("fixed", (2, 3), "<i2")
    assert cols["cat"].kind == "string" and cols["enum"].kind == "string" and cols["dec"].kind == "nested"
    got = decoded_columns(path)
    assert got["dec"][:4] == [Decimal("1.2500"), None, Decimal("-3.5000"), Decimal("12345678901234.5678")]
    assert got["arr"][2] == [3.0, None] and got["arr"][0].tolist() == [1.0, 2.0]
    assert got["enum"][:3] == ["lo", "hi", None]
    # Polars takes naive datetimes given for a time-zone dtype as UTC instants
    assert got["dtz"][0] == np.datetime64("2021-01-01T12:00:00", "us") == got["dms"][0]
    assert got["time"][3] == np.timedelta64(86399999999, "us")


# --- DuckDB -------------------------------------------------------------------------------------------

# column -> SQL expression of ``i`` (one row per i; every column is NULL where i % 5 = 1)
DUCKDB_COLUMNS = {
    "tiny": "i::TINYINT", "utiny": "i::UTINYINT", "small": "(i * 1000)::SMALLINT", "usmall": "i::USMALLINT",
    "int": "(i * 100000)::INTEGER", "uint": "i::UINTEGER", "big": "(i * 1000000000000)::BIGINT",
    "ubig": "(i * 1000000000000)::UBIGINT",
    "huge": "(i::HUGEINT * 100000000000000000000)",  # DuckDB writes HUGEINT as a double
    "flt": "(i / 3)::FLOAT", "dbl": "i / 7", "special": "['nan', 'inf', '-inf', '-0.0'][i % 4 + 1]::DOUBLE",
    "bool": "i % 2 = 0", "vc": "'s' || i || '中'", "blob": "('b' || i)::BLOB",
    "date": "DATE '2020-01-01' + i::INTEGER", "date_old": "DATE '0001-01-01' + i::INTEGER",
    "time": "TIME '12:34:56.789' + INTERVAL (i) SECOND", "timetz": "'12:34:56+02'::TIMETZ",
    "ts": "TIMESTAMP '2020-01-01 00:00:00.123456' + INTERVAL (i) HOUR",
    "ts_s": "('2020-01-01 00:00:01'::TIMESTAMP + INTERVAL (i) DAY)::TIMESTAMP_S",
    "ts_ms": "('2020-01-01 00:00:01.5'::TIMESTAMP + INTERVAL (i) DAY)::TIMESTAMP_MS",
    "ts_ns": "'2020-01-01 00:00:01.123456789'::TIMESTAMP_NS",
    "tstz": "TIMESTAMPTZ '2020-01-01 00:00:00+05' + INTERVAL (i) MINUTE",
    "interval": "INTERVAL (i) DAY + INTERVAL 3 MONTH + INTERVAL (i) MILLISECOND",  # FIXED_LEN_BYTE_ARRAY(12)
    "dec4": "(i / 4)::DECIMAL(4,1)", "dec18": "(i * 1.001)::DECIMAL(18,3)",
    "dec38": "(i * -1.0000000001)::DECIMAL(38,10)",
    "uuid": "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::UUID", "json": "('{\"a\": ' || i || '}')::JSON",
    "lst_uuid": "[md5(i::VARCHAR)::UUID, NULL]", "st_uuid": "{'id': md5(i::VARCHAR)::UUID, 'n': i}",
    "mp_uuid": "MAP {md5(i::VARCHAR)::UUID: i}", "lst_json": "[('[' || i || ']')::JSON, NULL]",
    "lst": "[i, NULL, i + 1]", "lst_rect": "[i, i]", "lst2": "[[i], [], NULL]", "lst_str": "['a', NULL, i::VARCHAR]",
    "lst_dec": "[1.5, NULL]::DECIMAL(5,2)[]", "lst_ts": "[TIMESTAMPTZ '2020-01-01 00:00:00+00', NULL]",
    "st": "{'a': i, 'b': 'x', 'c': [1.5, NULL], 'd': {'e': DATE '2000-01-01'}}",
    "mp": "MAP {'k1': i, 'k2': NULL}", "mp_lst": "MAP {i: [i::FLOAT, NULL]}",
    "enum": "['lo', 'hi'][i % 2 + 1]::ENUM('lo', 'hi')",
    "union": "union_value(num := i)::UNION(num INTEGER, str VARCHAR)",  # a struct in Parquet
    "bit": "'0101'::BIT",
    # a fixed-size ARRAY is written as a list; with a NULL array row DuckDB 2.0 writes a file pyarrow cannot
    # read ("Length spanned by list offsets larger than values array"), so this one has no NULL row
    "arr": "[i, i, i]::INTEGER[3]",
}


def _duckdb_file(tmp_path: Path, options: str) -> Path:
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "duck.parquet"
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"SET temp_directory = '{tmp_path / 'duck_tmp'}'")
        con.execute("SET threads = 1")
        select = ", ".join(f"{e} AS {k}" if k == "arr" else f"CASE WHEN i % 5 = 1 THEN NULL ELSE {e} END AS {k}"
                           for k, e in DUCKDB_COLUMNS.items())
        con.execute(f"COPY (SELECT {select} FROM range(24) t(i)) TO '{path}' (FORMAT PARQUET, {options})")
    finally:
        con.close()
    return path


@pytest.mark.parametrize("options", ["ROW_GROUP_SIZE_BYTES 3000",
                                     "ROW_GROUP_SIZE_BYTES 3000, PARQUET_VERSION V2, COMPRESSION zstd",
                                     "ROW_GROUP_SIZE_BYTES 3000, COMPRESSION gzip"])
def test_duckdb_copy_to_parquet(tmp_path: Path, options: str) -> None:
    path = _duckdb_file(tmp_path, options)
    # UUID and JSON come back as plain fixed_size_binary(16) / string here; with pyarrow's default
    # (arrow_extensions_enabled=True) they are the arrow.uuid / arrow.json extension types (next test)
    cols = assert_file_round_trips(path, min_row_groups=2, arrow_extensions_enabled=False)
    assert set(cols) == set(DUCKDB_COLUMNS)
    assert (cols["tstz"].dtype, cols["tstz"].tz) == ("<M8[us]", "UTC")
    assert cols["interval"].kind == "binary" and cols["uuid"].kind == "binary"
    assert {cols[k].kind for k in ("dec4", "dec18", "dec38", "st", "mp", "mp_lst", "union", "lst_str")} == {"nested"}
    got = decoded_columns(path, arrow_extensions_enabled=False)
    assert got["dec38"][:3] == [Decimal("0E-10"), None, Decimal("-2.0000000002")]
    assert got["mp"][0] == [("k1", 0), ("k2", None)] and got["mp"][1] is None
    assert got["st"][2] == {"a": 2, "b": "x", "c": [Decimal("1.5"), None], "d": {"e": np.datetime64("2000-01-01")}}
    assert got["tstz"][0] == np.datetime64("2019-12-31T19:00:00", "us")
    assert got["lst"][0] == [0, None, 1] and got["lst_rect"][0].tolist() == [0, 0]
    assert got["interval"][2] == (3).to_bytes(4, "little") + (2).to_bytes(4, "little") + (2).to_bytes(4, "little")


def test_duckdb_uuid_and_json_with_pyarrow_defaults(tmp_path: Path) -> None:
    """pyarrow's default reading of DuckDB's UUID / JSON columns (what the daemon reads): the arrow.uuid / arrow.json
    extension types, served as uuid.UUID and the JSON text, nested ones too (issue 22, item 6)."""
    path = _duckdb_file(tmp_path, "ROW_GROUP_SIZE_BYTES 3000")
    schema = pq.ParquetFile(path).schema_arrow
    assert schema.field("uuid").type == pa.uuid() and schema.field("json").type == pa.json_()
    assert schema.field("lst_uuid").type.value_type == pa.uuid()
    cols = assert_file_round_trips(path, min_row_groups=2)
    assert (cols["uuid"].kind, cols["json"].kind) == ("binary", "string")
    got = decoded_columns(path)
    one = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert got["uuid"][:3] == [one, None, one] and type(got["uuid"][0]) is uuid.UUID
    assert got["json"][:3] == ['{"a": 0}', None, '{"a": 2}']
    md5 = uuid.UUID(hashlib.md5(b"3").hexdigest())
    assert got["lst_uuid"][3] == [md5, None] and got["st_uuid"][3] == {"id": md5, "n": 3}
    assert got["mp_uuid"][3] == [(md5, 3)] and got["lst_json"][3] == ["[3]", None]
    table = pq.read_table(path)
    for k in ("uuid", "json", "lst_uuid", "st_uuid", "mp_uuid", "lst_json"):  # exactly pyarrow's as_py()
        assert got[k] == table.column(k).to_pylist(), k


# --- Hugging Face datasets ----------------------------------------------------------------------------


def _png(rgb: tuple[int, int, int]) -> bytes:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (2, 3), rgb).save(buf, format="PNG")
    return buf.getvalue()


def _wav(frames: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x01" * frames)
    return buf.getvalue()


def test_hugging_face_datasets_to_parquet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # offline, and every cache under tmp_path (set before the first import; patched too if already imported)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    pytest.importorskip("PIL")
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    from datasets import Array2D, Audio, ClassLabel, Dataset, Features, Image, Sequence, Value

    n = 7
    images = [None if i == 1 else {"bytes": _png((i * 30, 255 - i, 7)), "path": None if i % 2 else f"img{i}.png"}
              for i in range(n)]
    audio = [None if i == 2 else {"bytes": _wav(8 + i), "path": f"a{i}.wav"} for i in range(n)]
    features = Features({
        "image": Image(),
        # Audio.encode_example needs torchcodec to accept bytes; the same Arrow storage (struct<bytes, path>)
        # is written as a plain struct and cast to Audio, which keeps the feature in the schema metadata
        "audio": {"bytes": Value("binary"), "path": Value("string")},
        "label": ClassLabel(names=["cat", "dog", "bird"]),
        "vec": Sequence(Value("float32")),
        "tokens": Sequence(Value("string")),
        "meta": {"source": Value("string"), "score": {"value": Value("float64"), "votes": Value("int32")}},
        "grid": Array2D((2, 3), "float32"),
        "text": Value("large_string"),
        "when": Value("timestamp[ms, tz=UTC]"),
    })
    data = {
        "image": images,
        "audio": audio,
        "label": [0, 1, 2, None, 1, 0, 2],
        "vec": [[1.0, 2.0], [], None, [0.5], [1.0, 2.0], [3.0, 4.0], [float("nan"), -0.0]],
        "tokens": [["a", "b"], None, [], ["中文"], [""], ["x", "y", "z"], ["q"]],
        "meta": [{"source": "x", "score": {"value": 1.5, "votes": 3}}, None, {"source": None, "score": None},
                 {"source": "y", "score": {"value": None, "votes": 0}}] * 2,
        "grid": [[[1, 2, 3], [4, 5, 6]], None] + [[[i, i, i], [0, 0, 0]] for i in range(n - 2)],
        "text": ["a", None, "b", "c", "", "é", "中"],
        "when": [dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), None] * 3 + [dt.datetime(1970, 1, 1)],
    }
    data["meta"] = data["meta"][:n]
    ds = Dataset.from_dict(data, features=features).cast_column("audio", Audio(decode=False))
    path = tmp_path / "hf.parquet"
    datasets.disable_progress_bars()
    ds.to_parquet(str(path), batch_size=3)
    assert not ds.cache_files  # in memory: nothing written anywhere else
    cols = assert_file_round_trips(path, min_row_groups=3)
    assert set(cols) == set(features)
    assert cols["image"].info == {"hf_feature": "Image"}
    assert cols["audio"].info == {"hf_feature": "Audio"}
    assert cols["label"].info == {"hf_feature": "ClassLabel", "class_names": ["cat", "dog", "bird"]}
    assert cols["vec"].info["hf_feature"] in ("Sequence", "List")
    assert cols["meta"].info == {"hf_feature": "dict"}
    assert cols["grid"].info["hf_feature"] == "Array2D"
    assert (cols["label"].kind, cols["label"].dtype) == ("fixed", "<i8")
    assert (cols["vec"].kind, cols["vec"].dtype) == ("list", "<f4")
    assert cols["image"].kind == "nested"
    got = decoded_columns(path)
    # Image cells are {"bytes", "path"} dicts, the PNG bytes exact
    assert got["image"][1] is None
    for i in (0, 2, 3):
        assert got["image"][i] == images[i]
        assert list(got["image"][i]) == ["bytes", "path"] and type(got["image"][i]["bytes"]) is bytes
    assert got["image"][0]["bytes"].startswith(b"\x89PNG\r\n\x1a\n")
    assert got["audio"][0] == audio[0] and got["audio"][0]["bytes"][:4] == b"RIFF" and got["audio"][2] is None
    assert [None if v is None else int(v) for v in got["label"]] == data["label"]
    assert got["tokens"][:4] == [["a", "b"], None, [], ["中文"]]
    assert got["grid"][0].tolist() == [[1, 2, 3], [4, 5, 6]] and got["grid"][1] is None
    assert got["meta"][3] == {"source": "y", "score": {"value": None, "votes": 0}}
