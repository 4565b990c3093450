"""Partition columns: the values a file's place in a table gives each of its rows (``lang=en/part-0.parquet``).

A Hive folder's values are read from the path as Spark writes them (URL-encoded, ``__HIVE_DEFAULT_PARTITION__``
for null) and typed as ``pyarrow.dataset``'s hive partitioning infers them: int32 where every value is one, else
string; a pinned schema or a table's own schema (Delta) says otherwise. A sampler adds them to each unit it reads
as constant columns.
"""

from __future__ import annotations

import glob as _glob
import re
from typing import Iterable, Mapping
from urllib.parse import unquote

import pyarrow as pa

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_INT = re.compile(r"[+-]?\d+")
INT32 = (-(1 << 31), (1 << 31) - 1)

# a file's partition values: column -> its value as text (None: null)
Values = dict[str, str | None]


def base_dir(root: str) -> str:
    """The folder partition paths are relative to: the source's root, or a glob's part before its first wildcard."""
    if not _glob.has_magic(root):
        return root.rstrip("/")
    parts = root.split("/")
    fixed = [p for p in parts[:next(i for i, p in enumerate(parts) if _glob.has_magic(p))]]
    return "/".join(fixed)


def hive_values(path: str, root: str) -> Values:
    """The ``key=value`` folders of ``path`` below ``root``, decoded as Spark encodes them."""
    base = base_dir(root)
    rel = path[len(base):].lstrip("/") if path.startswith(base) else path
    out: Values = {}
    for segment in rel.split("/")[:-1]:
        key, sep, value = segment.partition("=")
        if not sep or not key:
            continue  # a plain folder: no partition column
        out[unquote(key)] = None if value == HIVE_NULL else unquote(value)
    return out


def infer_type(values: Iterable[str | None]) -> pa.DataType:
    """The type pyarrow's hive partitioning discovery gives a column of these values; a column of nulls only (which
    pyarrow refuses to type) is a string, so that a later file's value fits it."""
    seen = [v for v in values if v is not None]
    if not seen:
        return pa.string()
    if all(_INT.fullmatch(v) and INT32[0] <= int(v) <= INT32[1] for v in seen):
        return pa.int32()
    return pa.string()


def partition_types(files: Iterable[Mapping[str, str | None]], fixed: pa.Schema | None) -> dict[str, pa.DataType]:
    """Each partition column's type: as ``fixed`` (a pinned or the cache's schema) has it, else inferred from every
    file's values."""
    values: dict[str, list[str | None]] = {}
    for parts in files:
        for k, v in parts.items():
            values.setdefault(k, []).append(v)
    out = {}
    for k, vs in values.items():
        i = fixed.get_field_index(k) if fixed is not None else -1
        out[k] = fixed.field(i).type if i >= 0 else infer_type(vs)  # type: ignore[union-attr]
    return out


def with_partitions(schema: pa.Schema, parts: Mapping[str, str | None], types: Mapping[str, pa.DataType],
                    columns: Iterable[str] | None = None) -> pa.Schema:
    """A file's schema with its partition columns after its own (as pyarrow.dataset shows them); a column the file
    holds itself stays the file's."""
    wanted = set(columns) if columns else None
    extra = [pa.field(k, types.get(k, pa.string())) for k in parts
             if schema.get_field_index(k) < 0 and (wanted is None or k in wanted)]
    return pa.schema(list(schema) + extra, metadata=schema.metadata) if extra else schema


def value_array(value: str | None, typ: pa.DataType, n: int) -> pa.Array:
    """``n`` rows of one partition value as ``typ`` (pa.ArrowInvalid when the text is not of that type)."""
    if value is None or pa.types.is_null(typ):
        return pa.nulls(n, typ)
    scalar = pa.scalar(value, pa.string()).cast(typ)
    return pa.repeat(scalar, n)


def check_values(parts: Mapping[str, str | None], types: Mapping[str, pa.DataType]) -> str | None:
    """Why a file's partition values do not fit their columns' types (None: they fit)."""
    for k, v in parts.items():
        typ = types.get(k)
        if typ is None or v is None:
            continue
        try:
            value_array(v, typ, 1)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return f"partition column {k!r} is {v!r} in this file's path, which is no {typ} value"
    return None


def add_partitions(table: pa.Table, parts: Mapping[str, str | None], target: pa.Schema | None) -> pa.Table:
    """``table`` with its file's partition columns as constant columns, typed as ``target`` says."""
    for k, v in parts.items():
        if k in table.column_names:
            continue
        i = target.get_field_index(k) if target is not None else -1
        if target is not None and i < 0:
            continue  # not a wanted column
        typ = target.field(i).type if target is not None else (pa.string() if v is not None else pa.null())
        table = table.append_column(pa.field(k, typ), value_array(v, typ, table.num_rows))
    return table
