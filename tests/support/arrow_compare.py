"""Test support: compare decoded record cells with pyarrow's own values, cell by cell.

The decoder gives each cell in a documented form (``client/samplecache/format/record.py``,
``client/samplecache/format/nested.py``):

* null -> ``None`` at every level;
* a top-level number / bool / temporal scalar -> a numpy scalar of the leaf dtype;
* temporal values (at any level) -> ``numpy.datetime64`` / ``numpy.timedelta64`` with the column's unit:
  date32 -> ``datetime64[D]``, date64 -> ``datetime64[ms]``, timestamp[u] -> ``datetime64[u]`` (the UTC
  instant; the time zone is only in the schema), time32/64[u] -> ``timedelta64[u]`` since midnight,
  duration[u] -> ``timedelta64[u]``;
* a list (of lists...) of numbers whose cell is rectangular with no null element -> one ``numpy.ndarray``
  of the row's shape and the leaf dtype; any other such cell -> the Python list as ``as_py`` gives it
  (leaves Python int / float / bool, temporal leaves numpy scalars);
* string -> ``str``, binary / large_binary / fixed_size_binary -> ``bytes``;
* everything else as ``as_py``: struct -> dict (field order kept), map -> list of ``(key, value)`` tuples,
  decimal -> exact ``decimal.Decimal`` (same digits and exponent), null type -> ``None``;
* dictionary columns give their values, list views their lists;
* canonical extension types: uuid -> ``uuid.UUID`` (as ``as_py``), bool8 -> bool (a numpy ``bool_`` at the top
  level, as bool columns), json -> the JSON text as ``str``, fixed_shape_tensor -> an ndarray of the type's
  ``shape``, elements in stored order (``as_py`` gives them flat; no ``permutation`` applied), opaque and other
  extension types -> their storage's value.

``expected_cells`` is written from pyarrow alone (no samplecache code): temporal leaves are read as the
integers Arrow stores, so nothing is lost to ``datetime`` (nanoseconds, time zones, out-of-range years).
"""

from __future__ import annotations

import math
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["expected_cells", "assert_cells_equal", "leaf_dtype", "plain"]


# --- Arrow types ------------------------------------------------------------------------------------


def _storage_type(t: pa.DataType) -> pa.DataType:
    while True:
        if isinstance(t, pa.BaseExtensionType):  # Python-defined and canonical (uuid, json...) ones
            t = t.storage_type
        elif pa.types.is_dictionary(t):
            t = t.value_type
        else:
            return t


def _extension(t: pa.DataType) -> str | None:
    return t.extension_name if isinstance(t, pa.BaseExtensionType) else None


def _served_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type whose plain form a cell of ``t`` is served as: dictionaries as their values, bool8 as bool,
    a fixed_shape_tensor as fixed-size lists of its shape (a 0-d one as its value type), other extension types
    as their storage."""
    while True:
        ext = _extension(t)
        if ext == "arrow.bool8":
            return pa.bool_()
        if ext == "arrow.fixed_shape_tensor":
            out = t.value_type
            for size in reversed(t.shape):
                out = pa.list_(out, size)
            return out
        if ext is not None:
            t = t.storage_type
        elif pa.types.is_dictionary(t):
            t = t.value_type
        else:
            return t


def _is_temporal(t: pa.DataType) -> bool:
    return (pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t)
            or pa.types.is_duration(t))


def leaf_dtype(t: pa.DataType) -> np.dtype | None:
    """The numpy dtype a number / bool / temporal Arrow type decodes to, else None."""
    t = _served_type(t)
    if pa.types.is_boolean(t):
        return np.dtype(np.bool_)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype())
    if pa.types.is_date32(t):
        return np.dtype("datetime64[D]")
    if pa.types.is_date64(t):
        return np.dtype("datetime64[ms]")
    if pa.types.is_timestamp(t):
        return np.dtype(f"datetime64[{t.unit}]")
    if pa.types.is_time(t) or pa.types.is_duration(t):
        return np.dtype(f"timedelta64[{t.unit}]")
    return None


def _list_value_type(t: pa.DataType) -> pa.DataType | None:
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        return t.value_type
    return None


def numeric_list_chain(t: pa.DataType) -> tuple[list[int], np.dtype] | None:
    """For a list (of lists...) of numbers: ([size or -1 per level], leaf dtype); else None."""
    sizes: list[int] = []
    t = _served_type(t)
    while (vt := _list_value_type(t)) is not None:
        sizes.append(t.list_size if pa.types.is_fixed_size_list(t) else -1)
        t = _served_type(vt)
    dt = leaf_dtype(t)
    return (sizes, dt) if sizes and dt is not None else None


def _int_type(t: pa.DataType) -> pa.DataType:
    """``t`` with dictionaries decoded, extensions unwrapped and temporal leaves as their integers."""
    t = _storage_type(t)
    if _is_temporal(t):
        return pa.int32() if t.bit_width == 32 else pa.int64()
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_int_type(t.value_type)), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_int_type(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_int_type(t.value_type)))
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):  # as ``plain`` gives them
        return pa.large_list(t.value_field.with_type(_int_type(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_int_type(t.key_type)),
                       t.item_field.with_type(_int_type(t.item_type)), t.keys_sorted)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_int_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    return t


def _unview(arr: pa.Array) -> pa.Array:
    """A list view as a large list, rebuilt by hand: pyarrow 26's list_view -> list cast drops the last
    list's offset (``[[1, 2], [3]]`` becomes ``[[1, 2], []]``)."""
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int64())
    out = pa.LargeListArray.from_arrays(offsets, pc.list_flatten(arr), mask=arr.is_null(),
                                        type=pa.large_list(arr.type.value_field))
    assert out.to_pylist() == arr.to_pylist()
    return out


def plain(arr: Any) -> pa.Array:
    """One array: chunks combined, extension storage, top-level dictionary decoded, top-level list view
    as a large list."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    while True:
        if isinstance(arr, pa.ExtensionArray):
            arr = arr.storage
        elif pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        elif pa.types.is_list_view(arr.type) or pa.types.is_large_list_view(arr.type):
            arr = _unview(arr)
        else:
            return arr


def _tensor(t: pa.DataType, flat: list[Any]) -> Any:
    """A fixed_shape_tensor's flat storage list as nested lists of the type's shape (a 0-d one: its value)."""
    cells = [_temporal(t.value_type, x) for x in flat]
    if not t.shape:
        return cells[0]
    grid = np.empty(len(cells), dtype=object)
    for i, x in enumerate(cells):
        grid[i] = x
    return grid.reshape(t.shape).tolist()


def _temporal(t: pa.DataType, v: Any) -> Any:
    """Arrow's integers of a value of type ``t`` -> the documented form (temporal leaves numpy, canonical
    extension types as the module doc says)."""
    if v is None:
        return None
    ext = _extension(t)
    if ext == "arrow.uuid":
        return uuid.UUID(bytes=v)
    if ext == "arrow.bool8":
        return bool(v)
    if ext == "arrow.fixed_shape_tensor":
        return _tensor(t, v)
    if ext is not None:
        return _temporal(t.storage_type, v)
    t = _storage_type(t)
    if _is_temporal(t):
        return np.array(v, dtype=np.int64).view(leaf_dtype(t))[()]
    if (vt := _list_value_type(t)) is not None:
        return [_temporal(vt, x) for x in v]
    if pa.types.is_map(t):
        return [(_temporal(t.key_type, k), _temporal(t.item_type, x)) for k, x in v]
    if pa.types.is_struct(t):
        return {t.field(i).name: _temporal(t.field(i).type, v[t.field(i).name]) for i in range(t.num_fields)}
    return v


def expected_cells(arr: Any) -> list[Any]:
    """pyarrow's ``as_py`` of every cell of ``arr``, in the decoder's documented forms (see module doc);
    lists stay lists (``assert_cells_equal`` knows where the decoder gives an ndarray instead)."""
    typ = arr.type
    arr = plain(arr)
    target = _int_type(typ)
    if target != arr.type:
        arr = arr.cast(target)
    # struct fields may repeat a name in Arrow; to_pylist would fold them. Not in any corpus here.
    return [_temporal(typ, v) for v in arr.to_pylist()]


# --- comparison --------------------------------------------------------------------------------------


def _is_numpy_temporal(v: Any) -> bool:
    return isinstance(v, (np.datetime64, np.timedelta64))


def _deep_equal(got: Any, want: Any, where: str, numpy_leaves: np.dtype | None) -> None:
    """``got`` (a decoded value, ndarray cells already turned into lists of numpy scalars) == ``want``.

    ``numpy_leaves``: the dtype numbers must have (inside an ndarray / a top-level scalar); None means
    they must be Python int / float / bool. Temporal leaves are always numpy scalars of their unit."""
    if want is None:
        assert got is None, f"{where}: want None, got {got!r}"
        return
    assert got is not None, f"{where}: want {want!r}, got None"
    if _is_numpy_temporal(want):
        assert type(got) is type(want), f"{where}: want {type(want).__name__} {want!r}, got {type(got)} {got!r}"
        assert got.dtype == want.dtype, f"{where}: unit {got.dtype} != {want.dtype} ({got!r} vs {want!r})"
        assert got.astype(np.int64) == want.astype(np.int64), f"{where}: {got!r} != {want!r}"
        return
    if isinstance(want, bool):
        if numpy_leaves is not None:
            assert isinstance(got, np.bool_) and got.dtype == numpy_leaves, f"{where}: {type(got)} {got!r}"
        else:
            assert type(got) is bool, f"{where}: want a Python bool, got {type(got)} {got!r}"
        assert bool(got) == want, f"{where}: {got!r} != {want!r}"
        return
    if isinstance(want, int):
        if numpy_leaves is not None:
            assert isinstance(got, np.integer) and got.dtype == numpy_leaves, \
                f"{where}: want {numpy_leaves}, got {type(got)} {got!r}"
        else:
            assert type(got) is int, f"{where}: want a Python int, got {type(got)} {got!r}"
        assert int(got) == want, f"{where}: {got!r} != {want!r}"
        return
    if isinstance(want, (float, np.floating)):
        if numpy_leaves is not None:
            assert isinstance(got, np.floating) and got.dtype == numpy_leaves, \
                f"{where}: want {numpy_leaves}, got {type(got)} {got!r}"
        else:
            assert type(got) is float, f"{where}: want a Python float, got {type(got)} {got!r}"
        if math.isnan(want):
            assert math.isnan(got), f"{where}: {got!r} != nan"
        else:
            # Arrow's Python floats are exact (float16/32 widen losslessly): equality is bit equality
            assert float(got) == float(want), f"{where}: {got!r} != {want!r}"
            assert math.copysign(1, float(got)) == math.copysign(1, float(want)), f"{where}: sign of zero"
        return
    if isinstance(want, Decimal):
        assert type(got) is Decimal, f"{where}: want Decimal, got {type(got)} {got!r}"
        assert got.as_tuple() == want.as_tuple(), f"{where}: {got!r} != {want!r} (digits and exponent)"
        return
    if isinstance(want, uuid.UUID):
        assert type(got) is uuid.UUID and got == want, f"{where}: want {want!r}, got {type(got)} {got!r}"
        return
    if isinstance(want, (str, bytes)):
        assert type(got) is type(want), f"{where}: want {type(want).__name__}, got {type(got)} {got!r:.80}"
        assert got == want, f"{where}: {got!r:.200} != {want!r:.200}"
        return
    if isinstance(want, tuple):  # a map entry
        assert type(got) is tuple and len(got) == len(want), f"{where}: want a {len(want)}-tuple, got {got!r:.200}"
        for j, (g, w) in enumerate(zip(got, want)):
            _deep_equal(g, w, f"{where}[{j}]", numpy_leaves)
        return
    if isinstance(want, list):
        assert type(got) is list, f"{where}: want a list, got {type(got)} {got!r:.200}"
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for j, (g, w) in enumerate(zip(got, want)):
            _deep_equal(g, w, f"{where}[{j}]", numpy_leaves)
        return
    if isinstance(want, dict):
        assert type(got) is dict, f"{where}: want a dict, got {type(got)} {got!r:.200}"
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            _deep_equal(got[k], want[k], f"{where}.{k}", numpy_leaves)
        return
    raise AssertionError(f"{where}: unexpected expected value {type(want)} {want!r}")


def rectangle(value: list[Any], sizes: list[int]) -> tuple[int, ...] | None:
    """The shape of a list (of lists...) with no None inside and every level rectangular, else None.
    Below an empty level a fixed-size dimension keeps its size and a variable one is 0."""
    shape: list[int] = []
    level: list[Any] = [value]
    for size in sizes:
        if any(v is None for v in level):
            return None
        lens = {len(v) for v in level}
        if len(lens) > 1:
            return None
        n = lens.pop() if lens else 0
        shape.append(n if level else max(size, 0))
        level = [x for v in level for x in v]
    if any(v is None for v in level):
        return None
    return tuple(shape)


def _ndarray_items(a: np.ndarray) -> Any:
    """An ndarray as nested lists of numpy scalars (a 0-d array as one scalar)."""
    if a.ndim == 0:
        return a[()]
    return [_ndarray_items(x) if isinstance(x, np.ndarray) else x for x in a]


def assert_cells_equal(got: list[Any], arr: Any, where: str) -> None:
    """Every decoded cell in ``got`` is ``as_py`` of the same cell of ``arr``, in the documented form."""
    want = expected_cells(arr)
    assert len(got) == len(want), f"{where}: {len(got)} cells, want {len(want)}"
    typ = arr.type
    scalar_dtype = leaf_dtype(typ)
    chain = numeric_list_chain(typ)
    for i, (g, w) in enumerate(zip(got, want)):
        at = f"{where} row {i}"
        if w is None:
            assert g is None, f"{at}: want None, got {g!r:.200}"
            continue
        if scalar_dtype is not None:  # a top-level number / bool / temporal value: a numpy scalar
            assert isinstance(g, np.generic) and not isinstance(g, np.ndarray), f"{at}: {type(g)} {g!r}"
            assert g.dtype == scalar_dtype, f"{at}: dtype {g.dtype} != {scalar_dtype}"
            _deep_equal(g, w, at, scalar_dtype)
        elif chain is not None:
            sizes, dtype = chain
            shape = rectangle(w, sizes)
            if shape is not None:
                assert isinstance(g, np.ndarray), f"{at}: want an ndarray {shape}, got {type(g)} {g!r:.200}"
                assert g.dtype == dtype, f"{at}: dtype {g.dtype} != {dtype}"
                assert g.shape == shape, f"{at}: shape {g.shape} != {shape}"
                _deep_equal(_ndarray_items(g), w, at, dtype)
            else:
                _deep_equal(g, w, at, None)
        else:
            _deep_equal(g, w, at, None)
