"""Iceberg tables (issue 23): a source whose root holds ``metadata/*.metadata.json`` is read through its newest
metadata (pyiceberg), so only the data files live in the current snapshot are sampled; the newest metadata is read
again at each listing (an append adds units, an overwrite or delete marks the files it replaced); merge-on-read
deletes and renamed columns are refused by name; a table whose reader is not installed is refused with the extra.
A file:// table written by pyiceberg with a SQL catalog on sqlite."""

from __future__ import annotations

import importlib.util
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from lake_tables import iceberg_catalog
from staged_rows import served

from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.iceberg import metadata_files
from samplecache_service.remote.stores import FsspecRemote, RemoteError
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.writer import Writer

pytest.importorskip("pyiceberg")


def rows(start: int, n: int, langs: list[str]) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "x": pa.array([i * 0.5 for i in range(start, start + n)]),
                     "lang": pa.array([langs[i % len(langs)] for i in range(n)], pa.string())})


def partitioned_table(tmp_path: Path) -> Any:
    catalog = iceberg_catalog(tmp_path, f"file://{tmp_path / 'warehouse'}")
    table = catalog.create_table("ns.t", schema=rows(0, 1, ["en"]).schema)
    with table.update_spec() as spec:
        spec.add_identity("lang")
    return table


def truth(table: Any) -> list[dict[str, Any]]:
    table.refresh()
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])


def test_only_live_rows_are_sampled_as_the_table_changes(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    table = partitioned_table(tmp_path)
    table.append(rows(0, 100, ["en", "de"]))
    table.overwrite(rows(100, 50, ["en", "fr"]))
    location = table.location().removeprefix("file://")
    disc = Discovery(FsspecRemote(f"file://{location}"), catalog, writer, None)
    disc.run()
    assert disc.schema is not None and disc.schema.names == ["id", "x", "lang"]
    got = served(disc, catalog, tmp_path)
    assert len(got) == 50 and got == truth(table)  # not 150
    info = disc.table_info()
    assert info is not None and info["format"] == "iceberg" and info["rows"] == 50
    assert info["version"] == table.current_snapshot().snapshot_id
    # each file's identity partition values, from its manifest
    assert {tuple(i.partitions.items()) for i in catalog.files().values() if not i.removed} == {
        (("lang", "en"),), (("lang", "fr"),)}

    table.append(rows(150, 30, ["it"]))
    assert len(disc.run()) == 1
    assert served(disc, catalog, tmp_path) == truth(table) and len(truth(table)) == 80
    table.delete("id < 110")  # copy-on-write: the files it touches are rewritten
    disc.run()
    assert disc.removed_now > 0
    got = served(disc, catalog, tmp_path)
    assert got == truth(table) and len(got) == 70


def test_merge_on_read_deletes_are_refused(tmp_path: Path, cache: tuple[Catalog, Writer],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.table import DataScan

    catalog, writer = cache
    table = partitioned_table(tmp_path)
    table.append(rows(0, 20, ["en"]))
    plan = DataScan.plan_files

    # pyiceberg writes copy-on-write deletes only: the scan a Spark merge-on-read delete gives, one delete file
    def with_deletes(self: Any) -> Any:
        tasks = list(plan(self))
        for t in tasks:
            t.delete_files = {"positional delete"}
        return tasks
    monkeypatch.setattr(DataScan, "plan_files", with_deletes)
    disc = Discovery(FsspecRemote(f"file://{table.location().removeprefix('file://')}"), catalog, writer, None)
    with pytest.raises(RemoteError, match=r"1 delete file\(s\) \(merge-on-read deletes\)"):
        disc.run()
    assert catalog.files() == {}


def test_renamed_columns_are_refused(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    table = partitioned_table(tmp_path)
    table.append(rows(0, 20, ["en"]))
    with table.update_schema() as update:
        update.rename_column("x", "y")
    disc = Discovery(FsspecRemote(f"file://{table.location().removeprefix('file://')}"), catalog, writer, None)
    with pytest.raises(RemoteError, match=r"renamed columns \['x'\]"):
        disc.run()


def test_an_iceberg_table_without_pyiceberg_is_refused_with_the_extra(
        tmp_path: Path, cache: tuple[Catalog, Writer], monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, writer = cache
    table = partitioned_table(tmp_path)
    table.append(rows(0, 20, ["en"]))
    location = table.location().removeprefix("file://")
    assert len(metadata_files(FsspecRemote(f"file://{location}"))) >= 2
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyiceberg" else real(name, *a))
    disc = Discovery(FsspecRemote(f"file://{location}"), catalog, writer, None)
    with pytest.raises(RemoteError, match=r"is an Iceberg table .* pip install 'samplecache\[iceberg\]'"):
        disc.run()
    assert catalog.files() == {}


def test_a_pinned_snapshot_is_served_as_it_was(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    table = partitioned_table(tmp_path)
    table.append(rows(0, 30, ["en", "de"]))
    first = table.current_snapshot().snapshot_id
    table.overwrite(rows(100, 10, ["fr"]))
    location = table.location().removeprefix("file://")
    disc = Discovery(FsspecRemote(f"file://{location}", table_version=first), catalog, writer, None)
    disc.run()
    want = table.scan(snapshot_id=first).to_arrow()
    assert served(disc, catalog, tmp_path) == sorted(want.to_pylist(), key=lambda r: r["id"])
    info = disc.table_info()
    assert info is not None and (info["version"], info["pinned"], info["rows"]) == (first, True, 30)


def test_the_snapshot_a_table_had_at_a_time_is_served(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    table = partitioned_table(tmp_path)
    table.append(rows(0, 30, ["en"]))
    first = table.current_snapshot().snapshot_id
    time.sleep(0.05)
    then = datetime.now(timezone.utc)
    time.sleep(0.05)
    table.overwrite(rows(100, 10, ["fr"]))
    location = table.location().removeprefix("file://")
    disc = Discovery(FsspecRemote(f"file://{location}", table_as_of=then), catalog, writer, None)
    disc.run()
    info = disc.table_info()
    assert info is not None and (info["version"], info["pinned"], info["rows"]) == (first, True, 30)
    early = Discovery(FsspecRemote(f"file://{location}", table_as_of=datetime(2000, 1, 1, tzinfo=timezone.utc)),
                      catalog, writer, None)
    with pytest.raises(RemoteError, match="no snapshot as of 2000-01-01"):
        early.run()


def catalog_props(tmp_path: Path) -> dict[str, dict[str, str]]:
    """What ``[iceberg_catalogs.test]`` holds for the table of ``partitioned_table`` (its catalog is named test)."""
    return {"test": {"type": "sql", "uri": f"sqlite:///{tmp_path / 'iceberg-catalog.db'}",
                     "warehouse": f"file://{tmp_path / 'warehouse'}"}}


def test_a_table_named_through_its_catalog_is_read_where_the_catalog_says(
        tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    table = partitioned_table(tmp_path)
    table.append(rows(0, 40, ["en", "de"]))
    table.overwrite(rows(100, 15, ["fr"]))
    remote = FsspecRemote("iceberg://test/ns.t", catalogs=catalog_props(tmp_path))
    assert remote.url == "iceberg://test/ns.t" and remote.data_url == table.location()  # what the samplers open
    disc = Discovery(remote, catalog, writer, None)
    disc.run()
    assert served(disc, catalog, tmp_path) == truth(table)
    table.append(rows(200, 5, ["it"]))  # the catalog's new snapshot, seen by the next listing
    disc.run()
    info = disc.table_info()
    assert info is not None and info["rows"] == 20 and info["version"] == table.current_snapshot().snapshot_id


@pytest.mark.parametrize("url,catalogs,message", [
    ("iceberg://other/ns.t", None, r"names Iceberg catalog 'other', which the iceberg_catalogs setting does not "
                                   r"define \(it defines \['test'\]\)"),
    ("iceberg://test/t", None, r"iceberg://CATALOG/NAMESPACE.TABLE, not 'iceberg://test/t'"),
    ("iceberg://test/ns.missing", None, r"cannot load 'ns.missing' from Iceberg catalog 'test': NoSuchTableError"),
])
def test_a_catalog_source_that_cannot_be_loaded_says_why(tmp_path: Path, url: str, catalogs: Any,
                                                          message: str) -> None:
    partitioned_table(tmp_path)
    with pytest.raises(RemoteError, match=message):
        FsspecRemote(url, catalogs=catalogs or catalog_props(tmp_path))
