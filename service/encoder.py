"""Arrow -> record format: schema inference and block encoding (sampler side)."""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from samplecache.blockenc import ColumnData, encode_pieces
from samplecache.record import Column, Schema

DEFAULT_BLOCK_BYTES = 1 << 20


class UnsupportedColumn(ValueError):
    pass


_TIME_UNITS = {"s", "ms", "us", "ns"}


def _prim_dtype(t: pa.DataType) -> str | None:
    """The numpy dtype of a fixed-width Arrow scalar type (temporal types keep their unit), else None."""
    if pa.types.is_boolean(t):
        return "|b1"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return str(np.dtype(t.to_pandas_dtype()).str)
    if pa.types.is_date32(t):
        return "<M8[D]"
    if pa.types.is_date64(t):
        return "<M8[ms]"
    if pa.types.is_timestamp(t):
        return f"<M8[{t.unit}]"
    if pa.types.is_time(t) or pa.types.is_duration(t):
        return f"<m8[{t.unit}]"
    return None


def _storage(t: pa.DataType) -> pa.DataType:
    while True:
        if pa.types.is_dictionary(t):
            t = t.value_type
        elif isinstance(t, pa.BaseExtensionType):
            t = t.storage_type
        else:
            return t


def type_node(t: pa.DataType) -> dict[str, Any]:
    """The record format's type tree (``samplecache.nested``) of an Arrow type, or UnsupportedColumn."""
    t = _storage(t)
    dtype = _prim_dtype(t)
    if dtype is not None:
        node: dict[str, Any] = {"t": "prim", "dtype": dtype}
        if pa.types.is_timestamp(t) and t.tz:
            node["tz"] = t.tz
        return node
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return {"t": "string"}
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return {"t": "binary"}
    if pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t):
        return {"t": "fixed_binary", "width": t.byte_width}
    if pa.types.is_decimal(t):
        return {"t": "decimal", "width": t.byte_width, "scale": t.scale}
    if pa.types.is_null(t):
        return {"t": "null"}
    if pa.types.is_fixed_size_list(t):
        return {"t": "list", "size": t.list_size, "child": type_node(t.value_type)}
    if pa.types.is_map(t):
        return {"t": "map", "key": type_node(t.key_type), "value": type_node(t.item_type)}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return {"t": "list", "child": type_node(t.value_type)}
    if pa.types.is_struct(t):
        return {"t": "struct", "fields": [[t.field(i).name, type_node(t.field(i).type)] for i in range(t.num_fields)]}
    raise UnsupportedColumn(f"type {t} is not supported")


def column_for(field: pa.Field, info: dict[str, Any] | None = None) -> Column:
    """The record column for one Arrow field, or UnsupportedColumn."""
    node = type_node(field.type)
    arrow = str(field.type)
    if node["t"] in ("string", "binary", "fixed_binary"):
        kind = "string" if node["t"] == "string" else "binary"
        return Column(field.name, kind, None, (), field.nullable, {"t": kind}, None, arrow, info)
    shape: list[int] = []
    leaf = node
    while leaf["t"] == "list":
        shape.append(int(leaf.get("size", -1)))
        leaf = leaf["child"]
    if leaf["t"] != "prim":
        return Column(field.name, "nested", None, (), field.nullable, node, None, arrow, info)
    kind = "list" if -1 in shape else "fixed"
    return Column(field.name, kind, leaf["dtype"], tuple(shape), field.nullable, node, leaf.get("tz"), arrow, info)


def hf_features(arrow_schema: pa.Schema) -> dict[str, dict[str, Any]]:
    """{column: info} from the Hugging Face ``datasets`` features in the schema metadata: the feature's
    type (Image, Audio, ClassLabel, Sequence...) and a ClassLabel's names."""
    raw = (arrow_schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        features = json.loads(raw).get("info", {}).get("features", {}) or {}
    except (ValueError, AttributeError):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, feat in features.items():
        if not isinstance(feat, dict):
            continue
        info: dict[str, Any] = {"hf_feature": feat.get("_type", "Sequence" if "feature" in feat else "dict")}
        if feat.get("_type") == "ClassLabel" and "names" in feat:
            info["class_names"] = list(feat["names"])
        out[name] = info
    return out


def infer_schema(arrow_schema: pa.Schema, columns: Sequence[str] | None = None,
                 source_names: Sequence[str] | None = None) -> tuple[Schema, dict[str, str]]:
    """Record schema of the wanted columns, plus {column: reason} for columns left out. ``source_names``: the
    source's own columns, named when a wanted one is missing (``arrow_schema`` may hold only the wanted ones)."""
    wanted = list(columns) if columns else list(arrow_schema.names)
    missing = [c for c in wanted if c not in arrow_schema.names]
    if missing:
        names = list(source_names) if source_names is not None else arrow_schema.names
        raise UnsupportedColumn(f"columns {missing} are not in the source schema {names}")
    hf = hf_features(arrow_schema)
    cols, skipped = [], {}
    for name in wanted:
        try:
            cols.append(column_for(arrow_schema.field(name), hf.get(name)))
        except UnsupportedColumn as e:
            if columns:
                raise UnsupportedColumn(f"column {name!r} ({arrow_schema.field(name).type}): {e}") from None
            skipped[name] = f"{arrow_schema.field(name).type}: {e}"
    if not cols:
        raise UnsupportedColumn("no column can be served: "
                                + "; ".join(f"{k} ({v})" for k, v in skipped.items()))
    return Schema(tuple(cols)), skipped


class _Irregular(Exception):
    """A block of a fixed/list column with null elements or ragged rows: it takes the nested layout."""


def _plain(arr: Any) -> pa.Array:
    """One Arrow array in its plain storage form (chunks combined, dictionaries decoded, views cast)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()  # one chunk: no copy
    while True:
        t = arr.type
        if pa.types.is_dictionary(t):
            arr = arr.dictionary_decode()
        elif isinstance(arr, pa.ExtensionArray) or isinstance(t, pa.BaseExtensionType):
            arr = arr.storage
        elif pa.types.is_string_view(t):
            arr = arr.cast(pa.large_string())
        elif pa.types.is_binary_view(t):
            arr = arr.cast(pa.large_binary())
        elif pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
            arr = _unview(arr)
        else:
            return arr


def _unview(arr: pa.Array) -> pa.Array:
    """A list view as a large list (pyarrow's own cast gets the last offset wrong in some versions)."""
    lengths = np.asarray(pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False), np.int64)
    offsets = np.zeros(len(arr) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), pc.list_flatten(arr), type=pa.large_list(arr.type.value_field),
                                         mask=arr.is_null() if arr.null_count else None)


def _valid(arr: pa.Array) -> np.ndarray | None:
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8)


def _primitive(arr: pa.Array, dtype: str) -> np.ndarray:
    """Values of a fixed-width array as ``dtype`` (0 / False under nulls)."""
    arr = _plain(arr)
    dt = np.dtype(dtype)
    if dt.kind in "Mm":
        arr = arr.view(pa.int32() if arr.type.bit_width == 32 else pa.int64())
        if arr.null_count:
            arr = arr.fill_null(0)
        return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64).view(dt)
    if arr.null_count:
        arr = arr.fill_null(False if dtype == "|b1" else 0)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _offsets(arr: pa.Array) -> np.ndarray:
    return np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)


def nested_buffers(arr: Any, node: Mapping[str, Any], out: list[np.ndarray | None] | None = None
                   ) -> list[np.ndarray | None]:
    """The buffers of ``arr`` in the nested layout (``samplecache.nested``), depth first."""
    out = [] if out is None else out
    t = node["t"]
    if t == "null":
        return out
    arr = _plain(arr)
    n = len(arr)
    out.append(_valid(arr))
    if t == "prim":
        out.append(_primitive(arr, node["dtype"]))
    elif t in ("string", "binary"):
        cd = _bytes_like(arr)
        out.extend((cd.offsets, cd.data))
    elif t in ("fixed_binary", "decimal"):
        w = int(node["width"])
        buf = arr.buffers()[1]
        out.append(np.frombuffer(buf, np.uint8, n * w, arr.offset * w) if n else np.zeros(0, np.uint8))
    elif t == "list" and "size" in node:
        k = int(node["size"])
        nested_buffers(arr.values.slice(arr.offset * k, n * k), node["child"], out)
    elif t == "list":
        offs = _offsets(arr)
        out.append(offs - offs[0])
        nested_buffers(arr.values.slice(offs[0], offs[-1] - offs[0]), node["child"], out)
    elif t == "struct":
        for i in range(len(node["fields"])):
            nested_buffers(arr.field(i), node["fields"][i][1], out)
    elif t == "map":
        offs = _offsets(arr)
        out.append(offs - offs[0])
        nested_buffers(arr.keys.slice(offs[0], offs[-1] - offs[0]), node["key"], out)
        nested_buffers(arr.items.slice(offs[0], offs[-1] - offs[0]), node["value"], out)
    else:
        raise UnsupportedColumn(f"type node {t!r} is not supported")
    return out


def _nested(arr: pa.Array, col: Column) -> ColumnData:
    """Flatten (fixed-size) lists of numbers: leaf values, per-row leaf offsets and per-row shapes;
    _Irregular when an element inside is null or a row is ragged.

    ``starts`` are logical indices into the current level: row i covers
    elements ``[starts[i], starts[i+1])``.
    """
    n = len(arr)
    valid = _valid(arr)
    starts = np.arange(n + 1, dtype=np.int64)
    dims: list[np.ndarray] = []
    cur = arr
    for size in col.shape:
        cur = _plain(cur)
        if size >= 0:  # fixed_size_list: element j -> children [(offset + j) * size, ...)
            dims.append(np.full(n, size, dtype=np.int32))
            starts = (starts + cur.offset) * size
        else:
            offs = _offsets(cur)
            lens = np.diff(offs)[: starts[-1]]
            nz = np.diff(starts) > 0
            dim = np.zeros(n, dtype=np.int32)
            if nz.any():
                idx = starts[:-1][nz]
                lo, hi = np.minimum.reduceat(lens, idx), np.maximum.reduceat(lens, idx)
                if np.any(lo != hi):
                    raise _Irregular(f"column {col.name!r} has a ragged nested list in a row")
                dim[nz] = lo
            dims.append(dim)
            starts = offs[starts]
        cur = cur.values
        if cur.slice(starts[0], starts[-1] - starts[0]).null_count:
            raise _Irregular(f"column {col.name!r} has null elements")
    leaf = _primitive(cur.slice(starts[0], starts[-1] - starts[0]), col.dtype or "<f4")
    if col.kind == "fixed":
        return ColumnData(data=leaf.reshape((n,) + col.shape), valid=valid)
    shapes = np.stack(dims, axis=1).astype(np.int32)
    return ColumnData(data=leaf, offsets=starts - starts[0], shapes=shapes, valid=valid)


def _bytes_like(arr: pa.Array) -> ColumnData:
    arr = _plain(arr)
    valid = _valid(arr)
    target = pa.large_string() if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) else pa.large_binary()
    arr = arr.cast(target)
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], np.int64, len(arr) + 1, arr.offset * 8)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return ColumnData(data=data[offs[0]:offs[-1]], offsets=offs - offs[0], valid=valid)


def column_data(arr: Any, col: Column) -> ColumnData:
    """Encoder input for one column of a table slice."""
    arr = _plain(arr)
    if col.kind in ("string", "binary"):
        return _bytes_like(arr)
    if col.kind == "fixed" and not col.shape:
        return ColumnData(data=_primitive(arr, col.dtype or "<f4"), valid=_valid(arr))
    if col.kind in ("fixed", "list"):
        try:
            return _nested(arr, col)
        except _Irregular:
            pass
    return ColumnData(data=np.zeros(0, np.uint8), tree=nested_buffers(arr, col.type_node()))


def encode_table(table: pa.Table, schema: Schema, block_bytes: int = DEFAULT_BLOCK_BYTES) -> tuple[list[bytearray], int]:
    """Encode a table into blocks of about ``block_bytes``; returns (blocks, rows_per_block)."""
    pieces, rows_per_block = encode_table_pieces(table, schema, block_bytes)
    return [bytearray().join(p) for p in pieces], rows_per_block


def encode_table_pieces(table: pa.Table, schema: Schema,
                        block_bytes: int = DEFAULT_BLOCK_BYTES) -> tuple[list[list[memoryview]], int]:
    """``encode_table`` with every block as its pieces (``blockenc.encode_pieces``): views of ``table``'s buffers
    wherever the layout allows, so a sampler writes its staging file with no copy of the payload in between."""
    n = table.num_rows
    if n == 0:
        return [], 1
    per_row = max(1, table.nbytes // n)
    rows_per_block = max(1, min(n, block_bytes // per_row))
    return list(_blocks(table, schema, rows_per_block)), rows_per_block


def _blocks(table: pa.Table, schema: Schema, rows_per_block: int) -> Iterator[list[memoryview]]:
    for start in range(0, table.num_rows, rows_per_block):
        part = table.slice(start, rows_per_block)
        cols = [column_data(part.column(c.name), c) for c in schema.columns]
        yield encode_pieces(schema, cols, part.num_rows)
