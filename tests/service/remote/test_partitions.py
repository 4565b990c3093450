"""Hive partitions (issue 23): a file's ``key=value`` folders give each of its samples partition columns, typed as
pyarrow.dataset's hive partitioning infers them (or as a pinned schema says), in the schema and in every sampled
row; URL-encoded values and ``__HIVE_DEFAULT_PARTITION__`` (null) as Spark writes them. A file:// source."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from staged_rows import served

from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.partitions import HIVE_NULL, base_dir, hive_values, infer_type
from samplecache_service.remote.stores import FsspecRemote
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.fileinfo import FileInfo
from samplecache_service.store.writer import Writer

# Spark's folders: nested keys, a URL-encoded value ('d/e f' with '/' and ':' escaped), a null, an int beyond int32
FOLDERS = ["lang=en/n=1/big=3000000000", "lang=d%2Fe%3Af/n=__HIVE_DEFAULT_PARTITION__/big=1", "lang=fr/n=-7/big=2"]


def _table(tmp_path: Path) -> Path:
    src = tmp_path / "table"
    for k, folder in enumerate(FOLDERS):
        (src / folder).mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array([10 * k, 10 * k + 1], pa.int64())}), src / folder / "part-0.parquet")
    (src / "_SUCCESS").write_text("")
    return src


def test_hive_values_decoded_as_spark_writes_them() -> None:
    assert hive_values("b/t/lang=d%2Fe%3Af/n=__HIVE_DEFAULT_PARTITION__/part-0.parquet", "b/t") == \
        {"lang": "d/e:f", "n": None}
    assert hive_values("b/t/plain/lang=en/x.parquet", "b/t/") == {"lang": "en"}  # a plain folder is no column
    assert hive_values("b/t/lang=en/x.parquet", "b/t/*/*.parquet") == {"lang": "en"}
    assert base_dir("b/t/*/x/*.parquet") == "b/t"
    assert hive_values("b/t/x.parquet", "b/t") == {}


@pytest.mark.parametrize("values", [["1", "-7", None], ["1", "3000000000"], ["en", "1"], ["2024-01-01"],
                                    ["1.5"], ["true"]])
def test_types_inferred_as_pyarrow_dataset_infers_them(tmp_path: Path, values: list[str | None]) -> None:
    for k, v in enumerate(values):
        folder = tmp_path / f"p={HIVE_NULL if v is None else v}"
        folder.mkdir()
        pq.write_table(pa.table({"id": [k]}), folder / "part.parquet")
    got = ds.dataset(tmp_path, partitioning="hive").schema.field("p").type
    assert infer_type(values) == got


def test_a_column_of_nulls_only_is_a_string() -> None:
    assert infer_type([None, None]) == pa.string()  # pyarrow.dataset refuses to type it


def test_partition_columns_are_served_with_every_row(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    src = _table(tmp_path)
    disc = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None)
    assert len(disc.run()) == 3
    assert disc.schema is not None and disc.target is not None
    expected = ds.dataset(src, format="parquet", partitioning="hive",
                          exclude_invalid_files=True).to_table()
    # the schema (GET /v1/schema) has the partition columns, typed as pyarrow.dataset has them
    assert disc.schema.names == expected.column_names == ["id", "lang", "n", "big"]
    assert [disc.target.field(c).type for c in expected.column_names] == list(expected.schema.types)
    assert disc.target.field("n").type == pa.int32() and disc.target.field("big").type == pa.string()
    # each file's values are kept with it (the units' provenance: /v1/shards)
    info = catalog.file(next(p for p in catalog.files() if "lang=fr" in p))
    assert info.partitions == {"lang": "fr", "n": "-7", "big": "2"}
    assert FileInfo.from_json(info.to_json()) == info
    assert served(disc, catalog, tmp_path) == sorted(expected.to_pylist(), key=lambda r: r["id"])


def test_a_pinned_schema_types_the_partition_columns(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    src = _table(tmp_path)
    pinned = pa.schema([("id", pa.int64()), ("lang", pa.string()), ("n", pa.int64()), ("big", pa.int64())])
    pq.write_table(pinned.empty_table(), tmp_path / "schema.parquet")
    disc = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None, schema_file=tmp_path / "schema.parquet")
    disc.run()
    assert disc.target is not None and disc.target.field("big").type == pa.int64()
    rows = served(disc, catalog, tmp_path)
    assert [(r["lang"], r["n"], r["big"]) for r in rows[::2]] == [("en", 1, 3000000000), ("d/e:f", None, 1),
                                                                   ("fr", -7, 2)]


def test_columns_choose_among_partition_columns(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    src = _table(tmp_path)
    disc = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, ["lang", "id"])
    disc.run()
    assert disc.schema is not None and disc.schema.names == ["lang", "id"]
    assert [r["lang"] for r in served(disc, catalog, tmp_path)] == ["en", "en", "d/e:f", "d/e:f", "fr", "fr"]


def test_a_value_that_does_not_fit_the_column_quarantines_its_file(tmp_path: Path,
                                                                   cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    src = _table(tmp_path)
    disc = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None)
    disc.run()
    (src / "lang=it/n=x/big=3").mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([99], pa.int64())}), src / "lang=it/n=x/big=3/part-0.parquet")
    disc.run()
    info = catalog.file(next(p for p in catalog.files() if "lang=it" in p))
    assert info.quarantined and info.kind == "schema" and "'n' is 'x'" in info.reason, info
