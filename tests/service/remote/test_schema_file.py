"""``--schema-file``: reading the pinned schema (service/samplecache_service/remote/schemas.py
``load_schema_file``), the check that a file fits it without widening it (``check_fits``), and discovery's use
of both (a file:// source: unit tests; the same through a real daemon on S3 is in test_e2e_schema_file.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.schemas import (
    SchemaConflict,
    check_fits,
    conform,
    load_schema_file,
    normalize,
    to_text,
    unify,
)
from samplecache_service.remote.stores import FsspecRemote, RemoteError
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.writer import Writer

PINNED = pa.schema([pa.field("id", pa.int64()), pa.field("x", pa.float64()), pa.field("t", pa.string()),
                    pa.field("ts", pa.timestamp("us", tz="UTC"))])


# --------------------------------------------------------------------------------------------- load_schema_file
def write_parquet_empty(path: Path, schema: pa.Schema) -> None:
    pq.write_table(schema.empty_table(), path)  # the README's recipe


def write_parquet_rows(path: Path, schema: pa.Schema) -> None:
    """A data file of the dataset used as the schema file (it has rows and row groups)."""
    pq.write_table(pa.table({"id": [1, 2], "x": [0.5, None], "t": ["a", None],
                             "ts": pa.array([0, 1], pa.timestamp("us", tz="UTC"))}, schema=schema), path,
                   row_group_size=1)


def write_ipc_file(path: Path, schema: pa.Schema) -> None:
    with pa.ipc.new_file(path, schema):
        pass


def write_ipc_stream(path: Path, schema: pa.Schema) -> None:
    with pa.ipc.new_stream(path, schema) as w:
        w.write_table(schema.empty_table())


@pytest.mark.parametrize("write", [write_parquet_empty, write_parquet_rows, write_ipc_file, write_ipc_stream],
                         ids=["parquet-empty", "parquet-with-rows", "arrow-ipc-file", "arrow-ipc-stream"])
def test_schema_file_is_read_from_parquet_and_arrow_ipc(tmp_path: Path, write: object) -> None:
    path = tmp_path / "schema.bin"
    write(path, PINNED)  # type: ignore[operator]
    got = load_schema_file(path)
    assert got.names == PINNED.names and got.types == PINNED.types, got
    assert got.field("ts").type.tz == "UTC" and got.field("ts").type.unit == "us"


@pytest.mark.parametrize("content", [b"", b"id,x,t\n1,2.5,a\n", b"PAR1" + b"\0" * 64, b"ARROW1\0\0" + b"\xff" * 40],
                         ids=["empty", "csv", "parquet-magic-only", "arrow-magic-only"])
def test_a_file_that_is_neither_parquet_nor_arrow_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "schema.dat"
    path.write_bytes(content)
    with pytest.raises(SchemaConflict, match="neither a Parquet nor an Arrow IPC file") as ei:
        load_schema_file(path)
    assert str(path) in str(ei.value)


def test_a_missing_schema_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SchemaConflict) as ei:
        load_schema_file(tmp_path / "nowhere.parquet")
    assert str(ei.value) == f"--schema-file {tmp_path / 'nowhere.parquet'}: no such file"
    with pytest.raises(SchemaConflict, match="no such file"):
        load_schema_file(tmp_path)  # a directory is not a schema file either


# --------------------------------------------------------------------------------------------- check_fits
FITS = {
    "same types": pa.schema([("id", pa.int64()), ("x", pa.float64()), ("t", pa.string()),
                             ("ts", pa.timestamp("us", tz="UTC"))]),
    "int64 into float64": pa.schema([("id", pa.int64()), ("x", pa.int64())]),
    "narrower ints and floats": pa.schema([("id", pa.int8()), ("x", pa.float32())]),
    "null-typed columns": pa.schema([("id", pa.int64()), ("x", pa.null()), ("t", pa.null())]),
    "columns missing": pa.schema([("id", pa.int64())]),
    "an extra column": pa.schema([("id", pa.int64()), ("extra", pa.binary())]),
    "dictionary of the pinned type": pa.schema([("id", pa.int64()), ("t", pa.dictionary(pa.int32(), pa.string()))]),
    "coarser timestamp unit": pa.schema([("id", pa.int64()), ("ts", pa.timestamp("ms", tz="UTC"))]),
    # a DuckDB JSON column as pyarrow reads it now, where the cache began with its text
    "json in the pinned string column": pa.schema([("id", pa.int64()), ("t", pa.json_())]),
}


@pytest.mark.parametrize("name", list(FITS))
def test_files_that_fit_the_pinned_schema(name: str) -> None:
    file_schema = normalize(FITS[name])
    check_fits(PINNED, file_schema, "--schema-file")  # does not raise
    # ... and conform() gives such a file exactly the pinned columns and types
    table = conform(file_schema.empty_table(), PINNED)
    assert table.schema.names == PINNED.names and table.schema.types == PINNED.types


# file schema -> (column, the file's type, the pinned type) that the reason must name
REFUSED = {
    "string vs double": (pa.schema([("id", pa.int64()), ("x", pa.string())]), "x", "string", "double"),
    "list vs string": (pa.schema([("id", pa.int64()), ("t", pa.list_(pa.int32()))]), "t", "list<item: int32>",
                         "string"),
    "would widen int64 to double": (pa.schema([("id", pa.float64())]), "id", "double", "int64"),
    "would widen string to large_string": (pa.schema([("id", pa.int64()), ("t", pa.large_string())]), "t",
                                           "large_string", "string"),
    "would make the timestamp finer": (pa.schema([("ts", pa.timestamp("ns", tz="UTC"))]), "ts",
                                       "timestamp[ns, tz=UTC]", "timestamp[us, tz=UTC]"),
    "a dictionary of another type": (pa.schema([("x", pa.dictionary(pa.int8(), pa.string()))]), "x", "string",
                                     "double"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_file_that_does_not_fit_is_refused_naming_the_column_and_both_types(name: str) -> None:
    file_schema, column, mine, pinned = REFUSED[name]
    with pytest.raises(SchemaConflict) as ei:
        check_fits(PINNED, normalize(file_schema), "--schema-file")
    reason = str(ei.value)
    assert f"column {column!r}" in reason, reason
    assert f"is {mine} in this file" in reason, reason
    assert pinned in reason.split("in this file", 1)[1], reason
    if "widen" in name or "finer" in name:
        assert f"--schema-file has {pinned}, which would have to become {mine}" in reason, reason
    else:
        assert "cannot be unified" in reason, reason


# --------------------------------------------------------------------------------------------- discovery
def source_dir(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"id": pa.array([0, 1, 2], pa.int64()), "x": pa.array([1, 2, 3], pa.int64())}),
                   src / "a.parquet")  # fits: x int64 -> double; t and ts missing -> nulls
    pq.write_table(pa.table({"id": pa.array([3, 4], pa.int64()), "x": pa.array(["p", "q"])}),
                   src / "b.parquet")  # x string: cannot fit
    pq.write_table(pa.table({"id": pa.array([5.0, 6.0]), "x": pa.array([0.5, 1.5])}),
                   src / "c.parquet")  # id double: would widen the pinned int64
    return src


def test_discovery_takes_the_pinned_schema_and_quarantines_what_does_not_fit(
        tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    src = source_dir(tmp_path)
    schema_file = tmp_path / "schema.parquet"
    pq.write_table(PINNED.empty_table(), schema_file)
    disc = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None, schema_file=schema_file)
    new = disc.run()
    assert [Path(p).name for p in new] == ["a.parquet", "b.parquet", "c.parquet"], new  # all recorded
    assert disc.target is not None and disc.target.equals(normalize(PINNED)), disc.target
    assert disc.schema is not None and disc.schema.names == ["id", "x", "t", "ts"]
    files = {Path(p).name: info for p, info in catalog.files().items()}
    assert not files["a.parquet"].quarantined
    b, c = files["b.parquet"], files["c.parquet"]
    assert b.quarantined and b.kind == "schema" and c.quarantined and c.kind == "schema"
    assert "column 'x' is string in this file and double" in b.reason, b.reason
    assert "column 'id' is double in this file; --schema-file has int64" in c.reason, c.reason
    # the schema the sampling tasks carry is the pinned one, stored with the cache
    assert catalog.meta("arrow_schema_ipc") == to_text(disc.target)


def test_a_schema_file_other_than_the_cache_s_is_refused(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    src = source_dir(tmp_path)
    first = tmp_path / "schema.arrow"
    write_ipc_file(first, PINNED)
    Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None, schema_file=first).run()
    # the same schema again (from another format) is accepted; a different one is not
    again = tmp_path / "again.parquet"
    pq.write_table(PINNED.empty_table(), again)
    Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None, schema_file=again)
    other = tmp_path / "other.parquet"
    pq.write_table(PINNED.set(1, pa.field("x", pa.float32())).empty_table(), other)
    with pytest.raises(SchemaConflict, match="differs from the schema this cache dir was built with"):
        Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None, schema_file=other)


def test_columns_absent_from_the_schema_file_are_named(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    schema_file = tmp_path / "schema.parquet"
    pq.write_table(PINNED.empty_table(), schema_file)
    with pytest.raises(SchemaConflict) as ei:
        Discovery(FsspecRemote(f"file://{tmp_path}"), catalog, writer, ["id", "nope"], schema_file=schema_file)
    assert str(ei.value) == (f"--schema-file {schema_file} has no column ['nope']; it has "
                             f"['id', 'x', 't', 'ts']"), ei.value
    # columns the file has: only those are pinned
    disc = Discovery(FsspecRemote(f"file://{tmp_path}"), catalog, writer, ["x", "id"], schema_file=schema_file)
    assert disc.pinned is not None and disc.pinned.names == ["id", "x"]


def test_a_pin_no_file_fits_is_not_adopted_and_a_start_without_it_works(tmp_path: Path,
                                                                        cache: tuple[Catalog, Writer]) -> None:
    """Every file quarantined against the pin: discovery fails like a source with no readable file (the start
    stops, naming why) and stores no schema; the next start, without the pin, unifies the files and serves them."""
    catalog, writer = cache
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"id": pa.array([i], pa.int64())}), src / f"{i}.parquet")
    schema_file = tmp_path / "schema.parquet"
    pq.write_table(pa.schema([pa.field("id", pa.string())]).empty_table(), schema_file)
    disc = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None, schema_file=schema_file)
    with pytest.raises(RemoteError) as ei:
        disc.run()
    assert str(ei.value).startswith(f"no readable Parquet file under source 'file://{src}': schema: column 'id' "
                                    f"is int64 in this file and string in the dataset's schema"), ei.value
    assert disc.schema is None and catalog.meta("schema") is None and catalog.meta("arrow_schema_ipc") is None
    assert all(f.quarantined and f.kind == "schema" for f in catalog.files().values()), catalog.files()

    again = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None)
    assert sorted(Path(p).name for p in again.run()) == ["0.parquet", "1.parquet"]
    assert again.schema is not None and again.target is not None and again.target.field("id").type == pa.int64()
    assert not any(f.quarantined for f in catalog.files().values()), catalog.files()


# --------------------------------------------------------------------------------------------- extension types
def test_the_footer_schema_is_the_one_row_groups_are_read_with(tmp_path: Path, cache: tuple[Catalog, Writer]
                                                              ) -> None:
    """A Parquet UUID / JSON column without an Arrow schema in the file (as DuckDB writes it): pyarrow's readers
    give arrow.uuid / arrow.json, and so must the footer's schema, or the dataset's schema would cast the
    uuids back to 16 raw bytes (issue 22, item 6)."""
    import uuid

    catalog, writer = cache
    src = tmp_path / "src"
    src.mkdir()
    ids = pa.array([uuid.UUID(int=7).bytes, None], pa.binary(16))
    table = pa.table({"id": pa.ExtensionArray.from_storage(pa.uuid(), ids),
                      "doc": pa.ExtensionArray.from_storage(pa.json_(), pa.array(['{"a": 1}', None])),
                      "ids": pa.array([[uuid.UUID(int=8).bytes], []], pa.list_(pa.binary(16))).cast(
                          pa.list_(pa.uuid()))})
    pq.write_table(table, src / "a.parquet", store_schema=False)
    assert pq.ParquetFile(src / "a.parquet").metadata.schema.to_arrow_schema().field("id").type == pa.binary(16)
    remote = FsspecRemote(f"file://{src}")
    read = pq.ParquetFile(src / "a.parquet").read_row_group(0).schema
    assert remote.file_info(f"{src}/a.parquet")[1].equals(read)
    assert read.field("id").type == pa.uuid() and read.field("doc").type == pa.json_()
    disc = Discovery(remote, catalog, writer, None)
    disc.run()
    assert disc.target is not None and disc.target.field("id").type == pa.uuid()
    assert disc.schema is not None
    assert [dict(c.type_node()) for c in disc.schema.columns] == [
        {"t": "binary", "ext": "uuid"}, {"t": "string"},
        {"t": "list", "child": {"t": "fixed_binary", "width": 16, "ext": "uuid"}}]


def test_an_extension_type_and_its_storage_type_unify_as_the_storage() -> None:
    """Files where one column is arrow.uuid (DuckDB's, read by pyarrow) and fixed_size_binary(16) (another writer's),
    or a cache that began with the 16 bytes: the storage type, which every file fits; a cache of uuids refuses a
    file of plain bytes, naming both types."""
    plain = pa.schema([("u", pa.binary(16)), ("l", pa.list_(pa.binary(16)))])
    ext = pa.schema([("u", pa.uuid()), ("l", pa.list_(pa.uuid()))])
    assert unify(plain, ext).equals(plain) and unify(ext, plain).equals(plain)
    assert unify(ext, ext).equals(ext)
    check_fits(plain, ext, "the cache's schema")
    table = conform(pa.table({"u": pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"x" * 16], pa.binary(16))),
                              "l": pa.array([[b"y" * 16]], pa.list_(pa.binary(16))).cast(pa.list_(pa.uuid()))}),
                    plain)
    assert table.schema.equals(plain) and table.column("u").to_pylist() == [b"x" * 16]
    with pytest.raises(SchemaConflict) as ei:
        check_fits(ext, plain, "the cache's schema")
    assert "column 'u' is fixed_size_binary[16] in this file; the cache's schema has extension<arrow.uuid>" in \
        str(ei.value), ei.value

