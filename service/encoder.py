"""Arrow -> record format: schema inference and block encoding (sampler side)."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from samplecache.record import Column, ColumnData, Schema, encode_block

DEFAULT_BLOCK_BYTES = 1 << 20


class UnsupportedColumn(ValueError):
    pass


def _leaf_dtype(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "|b1"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype()).str
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return "<i4"
    if pa.types.is_temporal(t):
        return "<i8"
    raise UnsupportedColumn(f"type {t} is not supported")


def column_for(field: pa.Field) -> Column:
    """The record column for one Arrow field, or UnsupportedColumn."""
    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return Column(field.name, "string", None, (), field.nullable)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return Column(field.name, "binary", None, (), field.nullable)
    shape: list[int] = []
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        shape.append(t.list_size if pa.types.is_fixed_size_list(t) else -1)
        t = t.value_type
    dtype = _leaf_dtype(t)
    kind = "list" if -1 in shape else "fixed"
    return Column(field.name, kind, dtype, tuple(shape), field.nullable)


def infer_schema(arrow_schema: pa.Schema, columns: Sequence[str] | None = None) -> tuple[Schema, dict[str, str]]:
    """Record schema of the wanted columns, plus {column: reason} for columns left out."""
    wanted = list(columns) if columns else list(arrow_schema.names)
    missing = [c for c in wanted if c not in arrow_schema.names]
    if missing:
        raise UnsupportedColumn(f"columns {missing} are not in the source schema {arrow_schema.names}")
    cols, skipped = [], {}
    for name in wanted:
        try:
            cols.append(column_for(arrow_schema.field(name)))
        except UnsupportedColumn as e:
            if columns:
                raise UnsupportedColumn(f"column {name!r}: {e}") from None
            skipped[name] = str(e)
    if not cols:
        raise UnsupportedColumn(f"no supported column in the source schema; skipped: {skipped}")
    return Schema(tuple(cols)), skipped


def _primitive(arr: pa.Array, dtype: str) -> np.ndarray:
    if arr.null_count:
        arr = arr.fill_null(False if dtype == "|b1" else 0)
    if pa.types.is_temporal(arr.type):
        arr = arr.cast(pa.int32() if dtype == "<i4" else pa.int64())
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _nested(arr: pa.Array, col: Column) -> ColumnData:
    """Flatten (fixed-size) lists: leaf values, per-row leaf offsets and per-row shapes.

    ``starts`` are logical indices into the current level: row i covers
    elements ``[starts[i], starts[i+1])``.
    """
    n = len(arr)
    valid = None if arr.null_count == 0 else np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
    starts = np.arange(n + 1, dtype=np.int64)
    dims: list[np.ndarray] = []
    cur = arr
    for size in col.shape:
        if size >= 0:  # fixed_size_list: element j -> children [(offset + j) * size, ...)
            dims.append(np.full(n, size, dtype=np.int32))
            starts = (starts + cur.offset) * size
        else:
            offs = np.asarray(cur.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
            lens = np.diff(offs)[: starts[-1]]
            nz = np.diff(starts) > 0
            dim = np.zeros(n, dtype=np.int32)
            if nz.any():
                idx = starts[:-1][nz]
                lo, hi = np.minimum.reduceat(lens, idx), np.maximum.reduceat(lens, idx)
                if np.any(lo != hi):
                    raise UnsupportedColumn(f"column {col.name!r} has a ragged nested list in a row")
                dim[nz] = lo
            dims.append(dim)
            starts = offs[starts]
        cur = cur.values
    leaf = _primitive(cur.slice(starts[0], starts[-1] - starts[0]), col.dtype or "<f4")
    if col.kind == "fixed":
        return ColumnData(data=leaf.reshape((n,) + col.shape), valid=valid)
    shapes = np.stack(dims, axis=1).astype(np.int32)
    return ColumnData(data=leaf, offsets=starts - starts[0], shapes=shapes, valid=valid)


def _bytes_like(arr: pa.Array) -> ColumnData:
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    valid = None if arr.null_count == 0 else np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
    target = pa.large_string() if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) else pa.large_binary()
    arr = arr.cast(target)
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], np.int64, len(arr) + 1, arr.offset * 8)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return ColumnData(data=data[offs[0]:offs[-1]], offsets=offs - offs[0], valid=valid)


def column_data(arr: pa.Array, col: Column) -> ColumnData:
    """Encoder input for one column of a table slice."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if col.kind in ("string", "binary"):
        return _bytes_like(arr)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if col.kind == "fixed" and not col.shape:
        valid = None if arr.null_count == 0 else np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
        return ColumnData(data=_primitive(arr, col.dtype or "<f4"), valid=valid)
    return _nested(arr, col)


def encode_table(table: pa.Table, schema: Schema, block_bytes: int = DEFAULT_BLOCK_BYTES) -> tuple[list[bytearray], int]:
    """Encode a table into blocks of about ``block_bytes``; returns (blocks, rows_per_block)."""
    n = table.num_rows
    if n == 0:
        return [], 1
    per_row = max(1, table.nbytes // n)
    rows_per_block = max(1, min(n, block_bytes // per_row))
    return list(_blocks(table, schema, rows_per_block)), rows_per_block


def _blocks(table: pa.Table, schema: Schema, rows_per_block: int) -> Iterator[bytearray]:
    for start in range(0, table.num_rows, rows_per_block):
        part = table.slice(start, rows_per_block)
        cols = [column_data(part.column(c.name), c) for c in schema.columns]
        yield encode_block(schema, cols, part.num_rows)
