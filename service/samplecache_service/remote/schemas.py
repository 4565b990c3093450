"""One Arrow schema for the files of a dataset: unified by Arrow's permissive promotion, or pinned.

Rules (README "Schema across files"): a column that is ``null`` in one file takes the type of the others;
integers widen, and int with float becomes float; string with large_string becomes large_string;
timestamps take the finer unit; a column missing from a file reads as nulls; dictionary columns count as
their value type; an extension type (uuid, json...) with its own storage type becomes the storage type. A file
whose schema cannot be unified with the dataset's is quarantined with the column and both types. Once a cache
holds data its schema only takes files that fit it (no widening later).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq


class SchemaConflict(ValueError):
    """A file whose schema does not fit the dataset's."""


def normalize(schema: pa.Schema, columns: Sequence[str] | None = None) -> pa.Schema:
    """The file's schema as unification sees it: only the wanted columns, dictionaries as their values."""
    fields = []
    for f in schema:
        if columns and f.name not in columns:
            continue
        t = f.type
        while pa.types.is_dictionary(t):
            t = t.value_type
        fields.append(f.with_type(t))
    return pa.schema(fields, metadata=schema.metadata)


def storage_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every extension type in it, at any depth, as its storage type."""
    if isinstance(t, pa.BaseExtensionType):
        return storage_type(t.storage_type)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(storage_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(storage_type(t.key_type)),
                       t.item_field.with_type(storage_type(t.item_type)), t.keys_sorted)
    makers = {pa.types.is_fixed_size_list: lambda f: pa.list_(f, t.list_size), pa.types.is_list: pa.list_,
              pa.types.is_large_list: pa.large_list, pa.types.is_list_view: pa.list_view,
              pa.types.is_large_list_view: pa.large_list_view}
    for test, make in makers.items():
        if test(t):
            return make(t.value_field.with_type(storage_type(t.value_type)))
    return t


def _agree(a: pa.Schema, b: pa.Schema) -> tuple[pa.Schema, pa.Schema]:
    """``a`` and ``b`` with a column that is an extension type in one and its storage type in the other as the
    storage type in both (pyarrow reads a DuckDB UUID column as arrow.uuid; a file of the same column written as
    fixed_size_binary(16), or a cache that began before the daemon read UUIDs so, has the storage type)."""
    plain = {}
    for f in b:
        i = a.get_field_index(f.name)
        if i >= 0 and a.field(i).type != f.type and storage_type(a.field(i).type) == storage_type(f.type):
            plain[f.name] = storage_type(f.type)

    def fix(s: pa.Schema) -> pa.Schema:
        return pa.schema([f.with_type(plain[f.name]) if f.name in plain else f for f in s], metadata=s.metadata)
    return (fix(a), fix(b)) if plain else (a, b)


def _merge(a: pa.Schema, b: pa.Schema) -> pa.Schema:
    return pa.unify_schemas(list(_agree(a, b)), promote_options="permissive")


def _conflict(current: pa.Schema, file_schema: pa.Schema, err: Exception) -> SchemaConflict:
    for f in file_schema:
        i = current.get_field_index(f.name)
        if i < 0:
            continue
        try:
            _merge(pa.schema([current.field(i)]), pa.schema([f]))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return SchemaConflict(f"column {f.name!r} is {f.type} in this file and {current.field(i).type} in the "
                                  f"dataset's schema: they cannot be unified")
    return SchemaConflict(f"schema cannot be unified with the dataset's: {err}")


def unify(current: pa.Schema | None, file_schema: pa.Schema) -> pa.Schema:
    """``current`` widened to take ``file_schema`` (already normalized), or SchemaConflict."""
    if current is None:
        return file_schema
    try:
        return _merge(current, file_schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise _conflict(current, file_schema, e) from None


def check_fits(pinned: pa.Schema, file_schema: pa.Schema, why: str) -> None:
    """SchemaConflict unless every column of ``file_schema`` fits ``pinned`` without widening it."""
    merged = unify(pinned, file_schema)
    for f in pinned:
        got = merged.field(f.name).type
        if got != f.type:
            mine = file_schema.field(f.name).type
            raise SchemaConflict(f"column {f.name!r} is {mine} in this file; {why} has {f.type}, which would have "
                                 f"to become {got}")


def conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` with exactly ``target``'s columns and types: cast where the file's type differs, nulls where
    the file lacks a column."""
    cols = []
    for f in target:
        if f.name in table.column_names:
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=pa.schema([f.with_nullable(True) if f.name not in table.column_names
                                                         else f for f in target], metadata=target.metadata))


def to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def load_schema_file(path: Path) -> pa.Schema:
    """The schema of a Parquet file or an Arrow IPC (file or stream) file."""
    if not path.is_file():
        raise SchemaConflict(f"--schema-file {path}: no such file")
    errors = []
    readers: list[Callable[[], pa.Schema]] = [lambda: pq.read_schema(path), lambda: pa.ipc.open_file(path).schema,
                                              lambda: pa.ipc.open_stream(path).schema]
    for read in readers:
        try:
            return read()
        except (pa.ArrowInvalid, OSError) as e:
            errors.append(str(e))
    raise SchemaConflict(f"--schema-file {path}: neither a Parquet nor an Arrow IPC file ({errors[0]})")
