"""Arrow -> record format: a table's rows as checksummed blocks (sampler side)."""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from samplecache.format.blockenc import ColumnData, encode_pieces
from samplecache.format.record import Column, Schema
from samplecache_service.remote.columns import UnsupportedColumn

DEFAULT_BLOCK_BYTES = 1 << 20


class _Irregular(Exception):
    """A block of a fixed/list column with null elements or ragged rows: it takes the nested layout."""


def _plain(arr: Any, node: Mapping[str, Any] | None = None) -> pa.Array:
    """One Arrow array in its plain storage form (chunks combined, dictionaries decoded, views cast). ``node``: the
    type node it is stored as, which says whether a fixed_shape_tensor takes the fixed-size lists of its shape."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()  # one chunk: no copy
    while True:
        t = arr.type
        if pa.types.is_dictionary(t):
            arr = arr.dictionary_decode()
        elif isinstance(arr, pa.ExtensionArray) or isinstance(t, pa.BaseExtensionType):
            shaped = node is not None and t.extension_name == "arrow.fixed_shape_tensor" and _shaped(t.shape, node)
            arr = _tensor_lists(arr, list(t.shape)) if shaped else arr.storage
        elif pa.types.is_string_view(t):
            arr = arr.cast(pa.large_string())
        elif pa.types.is_binary_view(t):
            arr = arr.cast(pa.large_binary())
        elif pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
            arr = _unview(arr)
        else:
            return arr


def _shaped(shape: list[int], node: Mapping[str, Any]) -> bool:
    """Whether a schema stores a tensor of ``shape`` as fixed-size lists of that shape (a 0-d one as its value); a
    schema inferred before tensors had their shape (one flat list) keeps their storage."""
    for size in shape:
        if node["t"] != "list" or node.get("size") != size:
            return False
        node = node["child"]
    return bool(shape) or node["t"] != "list"


def _tensor_lists(arr: pa.Array, shape: list[int]) -> pa.Array:
    """A fixed_shape_tensor array as nested fixed-size lists of its shape, over its storage's values (no copy)."""
    storage = arr.storage
    n, k = len(storage), math.prod(shape)
    values = storage.values.slice(storage.offset * k, n * k)
    if not shape:  # a 0-d tensor: its one value
        return pc.if_else(storage.is_valid(), values, pa.scalar(None, values.type)) if storage.null_count else values
    for level in range(len(shape) - 1, 0, -1):  # innermost first; level i has n * prod(shape[:i]) lists
        typ = pa.list_(values.type, shape[level])
        values = pa.Array.from_buffers(typ, n * math.prod(shape[:level]), [None], children=[values])
    valid = storage.is_valid().buffers()[1] if storage.null_count else None
    return pa.Array.from_buffers(pa.list_(values.type, shape[0]), n, [valid], children=[values])


def _unview(arr: pa.Array) -> pa.Array:
    """A list view as a large list (pyarrow's own cast gets the last offset wrong in some versions)."""
    lengths = np.asarray(pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False), np.int64)
    offsets = np.zeros(len(arr) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), pc.list_flatten(arr),
                                         type=pa.large_list(arr.type.value_field),
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
        arr = arr.fill_null(False if pa.types.is_boolean(arr.type) else 0)
    # a bool8 column's int8 storage becomes True where it is not 0, as its as_py() does
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _offsets(arr: pa.Array) -> np.ndarray:
    return np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)


def nested_buffers(arr: Any, node: Mapping[str, Any], out: list[np.ndarray | None] | None = None
                   ) -> list[np.ndarray | None]:
    """The buffers of ``arr`` in the nested layout (``samplecache.format.nested``), depth first."""
    out = [] if out is None else out
    t = node["t"]
    if t == "null":
        return out
    arr = _plain(arr, node)
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
    node = col.type_node()
    for size in col.shape:
        cur = _plain(cur, node)
        node = node["child"]
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
    target = (pa.large_string() if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
              else pa.large_binary())
    arr = arr.cast(target)
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], np.int64, len(arr) + 1, arr.offset * 8)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return ColumnData(data=data[offs[0]:offs[-1]], offsets=offs - offs[0], valid=valid)


def column_data(arr: Any, col: Column) -> ColumnData:
    """Encoder input for one column of a table slice."""
    arr = _plain(arr, col.type_node())
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


def encode_table(table: pa.Table, schema: Schema,
                 block_bytes: int = DEFAULT_BLOCK_BYTES) -> tuple[list[bytearray], int]:
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
