"""Delta Lake tables (issue 23): a source whose root holds ``_delta_log/`` is read through the log (delta-rs), so
only the files live in the table's version are sampled; the version is read again at each listing (an append adds
units, an overwrite or delete marks the files it removed, which are never sampled again); partition values come
from the log; a table whose reader is not installed, or with deletion vectors or column mapping, is refused by
name. A file:// table, written by deltalake in a subprocess."""

from __future__ import annotations

import importlib.util
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lake_tables import delete_delta, live_rows, optimize_delta, write_delta
from staged_rows import served

from samplecache_service.cli.status import format_status
from samplecache_service.http.models import TableStatus
from samplecache_service.remote.delta import delta_options
from samplecache_service.remote.discovery import Discovery, owner_of
from samplecache_service.remote.stores import FsspecRemote, RemoteError, TableRefused
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.writer import Writer

pytest.importorskip("deltalake")


def rows(start: int, n: int, lang: list[str | None]) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "x": pa.array([float(i) / 4 for i in range(start, start + n)]),
                     "lang": pa.array([lang[i % len(lang)] for i in range(n)], pa.string()),
                     "day": pa.array([i % 3 for i in range(n)], pa.int64())})


def truth(uri: str, names: list[str]) -> list[dict[str, Any]]:
    return sorted(live_rows(uri).select(names).to_pylist(), key=lambda r: r["id"])


def test_only_live_rows_are_sampled_as_the_table_changes(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    uri = str(tmp_path / "table")
    write_delta(uri, rows(0, 100, ["en", "d/e f"]), tmp_path, partition_by=["lang", "day"])
    write_delta(uri, rows(100, 50, ["en", None]), tmp_path, mode="overwrite", partition_by=["lang", "day"])
    remote = FsspecRemote(f"file://{uri}")
    disc = Discovery(remote, catalog, writer, None)
    disc.run()
    assert disc.schema is not None
    # the partition columns typed as the table's schema has them (day int64: Hive inference would say int32)
    assert disc.target is not None and disc.target.field("day").type == pa.int64()
    names = disc.schema.names
    assert sorted(names) == ["day", "id", "lang", "x"]
    got = served(disc, catalog, tmp_path)
    assert len(got) == 50 and got == truth(uri, names)  # not 150: the overwritten files are not live
    assert {r["lang"] for r in got} == {"en", None}
    info = disc.table_info()
    assert info is not None and info["format"] == "delta" and info["version"] == 1 and info["rows"] == 50

    # an append: new units; then a delete (delta-rs rewrites the files it touches): they leave the table
    write_delta(uri, rows(150, 30, ["fr"]), tmp_path, partition_by=["lang", "day"])
    assert len(disc.run()) == 3
    assert served(disc, catalog, tmp_path) == truth(uri, names) and len(truth(uri, names)) == 80
    delete_delta(uri, "id < 110 or id >= 175")
    disc.run()
    assert disc.removed_now > 0
    removed = [p for p, i in catalog.files().items() if i.removed]
    assert removed and all(p not in remote.sizes for p in removed)
    assert catalog.removed_files() == set(removed)  # what eviction and sealing look up, kept per files' version
    got = served(disc, catalog, tmp_path)
    assert got == truth(uri, names) and len(got) == 80 - 10 - 5
    info = disc.table_info()
    assert info is not None and info["version"] == 3 and info["removed_files"] == len(removed)


def test_a_delta_table_without_deltalake_is_refused_with_the_extra(tmp_path: Path, cache: tuple[Catalog, Writer],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, writer = cache
    uri = str(tmp_path / "table")
    write_delta(uri, rows(0, 10, ["en"]), tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deltalake" else real(name, *a))
    disc = Discovery(FsspecRemote(f"file://{uri}"), catalog, writer, None)
    with pytest.raises(RemoteError, match=r"is a Delta Lake table .* pip install 'samplecache\[delta\]'"):
        disc.run()
    assert catalog.files() == {}  # never read as a plain folder


@pytest.mark.parametrize("protocol, feature", [
    ('{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["deletionVectors"],'
     '"writerFeatures":["deletionVectors"]}', "deletionVectors"),
    ('{"minReaderVersion":2,"minWriterVersion":5}', "column mapping")])
def test_deletion_vectors_and_column_mapping_are_refused_by_name(tmp_path: Path, cache: tuple[Catalog, Writer],
                                                                 protocol: str, feature: str) -> None:
    catalog, writer = cache
    uri = tmp_path / "table"
    version = write_delta(str(uri), rows(0, 10, ["en"]), tmp_path)
    (uri / "_delta_log" / f"{version + 1:020d}.json").write_text(f'{{"protocol":{protocol}}}\n')
    disc = Discovery(FsspecRemote(f"file://{uri}"), catalog, writer, None)
    with pytest.raises(RemoteError, match=feature):
        disc.run()
    assert catalog.files() == {}


def test_a_plain_folder_stays_a_plain_folder(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    uri = tmp_path / "table"
    write_delta(str(uri), rows(0, 10, ["en"]), tmp_path)
    # a folder that merely holds a Delta table below its root is listed as files
    disc = Discovery(FsspecRemote(f"file://{tmp_path}"), catalog, writer, None)
    disc.run()
    assert disc.table_info() is None and len(catalog.files()) == 1


def test_delta_options_from_fsspec_options() -> None:
    opts = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:8333",
                                                         "region_name": "eu-west-1"}}
    assert delta_options(opts, None) == {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                                         "AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "AWS_ALLOW_HTTP": "true",
                                         "AWS_REGION": "eu-west-1"}
    assert delta_options({}, "https://s3.example") == {"AWS_ENDPOINT_URL": "https://s3.example"}


def test_status_shows_the_table(idle_status: Callable[..., dict[str, Any]]) -> None:
    table = {"format": "delta", "version": 3, "pinned": False, "files": 4, "rows": 65, "removed_files": 2,
             "seen_at": 1.0}
    assert TableStatus(**table).version == 3  # what /v1/status carries
    status = idle_status(table=table)
    rows = {line.split("  ")[0].strip(): line for line in format_status(status).splitlines()}
    assert rows["table"].endswith("delta version 3 (newest), 4 live files, 65 rows; 2 files removed"), rows


def test_a_pinned_version_is_served_as_it_was(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    from deltalake import DeltaTable

    catalog, writer = cache
    uri = str(tmp_path / "table")
    write_delta(uri, rows(0, 40, ["en"]), tmp_path)
    write_delta(uri, rows(100, 10, ["fr"]), tmp_path, mode="overwrite")
    disc = Discovery(FsspecRemote(f"file://{uri}", table_version=0), catalog, writer, None)
    disc.run()
    assert disc.schema is not None
    want = pa.table(DeltaTable(uri, version=0).to_pyarrow_table()).select(disc.schema.names)
    assert served(disc, catalog, tmp_path) == sorted(want.to_pylist(), key=lambda r: r["id"])
    info = disc.table_info()
    assert info is not None and (info["version"], info["pinned"], info["rows"]) == (0, True, 40)
    write_delta(uri, rows(200, 5, ["it"]), tmp_path)
    assert disc.run() == [] and len(served(disc, catalog, tmp_path)) == 40  # later versions are not followed


def test_the_version_a_table_had_at_a_time_isserved(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    uri = str(tmp_path / "table")
    write_delta(uri, rows(0, 40, ["en"]), tmp_path)
    time.sleep(0.05)
    then = datetime.now(timezone.utc)
    time.sleep(0.05)
    write_delta(uri, rows(100, 10, ["fr"]), tmp_path, mode="overwrite")
    disc = Discovery(FsspecRemote(f"file://{uri}", table_as_of=then), catalog, writer, None)
    disc.run()
    info = disc.table_info()
    assert info is not None and (info["version"], info["pinned"], info["rows"]) == (0, True, 40)
    assert [r["id"] for r in served(disc, catalog, tmp_path)] == list(range(40))
    both = FsspecRemote(f"file://{uri}", table_version=0, table_as_of=then)
    with pytest.raises(RemoteError, match="not both"):
        both.list_files()


def test_an_optimize_replaces_small_files_and_serves_the_same_rows(tmp_path: Path,
                                                                   cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    uri = str(tmp_path / "table")
    for k in range(4):
        write_delta(uri, rows(10 * k, 10, ["en"]), tmp_path, partition_by=["lang"])
    disc = Discovery(FsspecRemote(f"file://{uri}"), catalog, writer, None)
    disc.run()
    assert disc.schema is not None
    before = served(disc, catalog, tmp_path)
    assert len(before) == 40 and len(catalog.files()) == 4
    optimize_delta(uri)
    assert len(disc.run()) == 1  # the compacted file
    assert disc.removed_now == 4
    assert served(disc, catalog, tmp_path) == before == truth(uri, disc.schema.names)  # each row once, not twice


def test_a_feature_taken_on_later_stops_the_table_until_it_is_gone(tmp_path: Path,
                                                                   cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    uri = tmp_path / "table"
    version = write_delta(str(uri), rows(0, 10, ["en"]), tmp_path)
    disc = Discovery(FsspecRemote(f"file://{uri}"), catalog, writer, None)
    disc.run()
    assert disc.refused is None
    dv = uri / "_delta_log" / f"{version + 1:020d}.json"
    dv.write_text('{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["deletionVectors"],'
                  '"writerFeatures":["deletionVectors"]}}\n')
    with pytest.raises(TableRefused, match="deletionVectors"):
        disc.run()
    assert disc.refused is not None and "deletionVectors" in disc.refused  # the daemon seals and samples nothing


def test_a_table_source_leaves_another_sources_files_alone(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    """Two sources on one cache, a Delta table and a plain folder: the table's listing marks removed only files of
    its own that left the table, never the folder's (which it does not list; before, they were marked at each of
    its listings and live again at each of the folder's), and its status counts only its own."""
    catalog, writer = cache
    uri = str(tmp_path / "table")
    write_delta(uri, rows(0, 40, ["en"]), tmp_path)
    folder = tmp_path / "folder"
    folder.mkdir()
    pq.write_table(rows(1000, 30, ["de"]), folder / "part-0.parquet")
    lake, plain = FsspecRemote(f"file://{uri}"), FsspecRemote(f"file://{folder}")
    owns_lake, owns_plain = owner_of(lake), owner_of(plain)
    d_plain = Discovery(plain, catalog, writer, None, source="plain", owns=owns_plain)
    d_lake = Discovery(lake, catalog, writer, None, source="lake", owns=owns_lake)
    d_plain.run()
    d_lake.run()
    write_delta(uri, rows(40, 10, ["en"]), tmp_path, mode="overwrite")
    d_lake.run()
    files = catalog.files()
    mine = [p for p in files if owns_plain(p)]
    assert len(mine) == 1 and not files[mine[0]].removed  # the folder's file is live
    gone = [p for p, i in files.items() if i.removed]
    assert gone and all(owns_lake(p) for p in gone) and d_lake.removed_now == len(gone)  # the overwrite's only
    info = d_lake.table_info()
    assert info is not None and info["removed_files"] == len(gone)
    d_plain.run()
    assert d_plain.removed_now == 0 and catalog.removed_files() == set(gone)


def test_a_source_owns_the_files_under_its_root_a_folder_boundary_apart(tmp_path: Path) -> None:
    """``b/t`` owns ``b/t/x`` and itself (one file), never ``b/t2/x``: a table source beside a source whose root
    only starts with the same letters leaves its files alone; a glob owns what lies under its fixed part."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t2").mkdir()
    owns = owner_of(FsspecRemote(f"file://{tmp_path}/t/"))
    assert owns(f"{tmp_path}/t/part-0.parquet") and owns(f"{tmp_path}/t/lang=en/part-0.parquet")
    assert not owns(f"{tmp_path}/t2/part-0.parquet") and not owns(f"{tmp_path}/tx")
    globbed = owner_of(FsspecRemote(f"file://{tmp_path}/t*/part-*.parquet"))
    assert globbed(f"{tmp_path}/t2/part-0.parquet") and not globbed(f"{tmp_path}/u/part-0.parquet")
