"""Partition filters (issue 23): ``--filter`` limits sampling to the partitions it matches, decided from the
listing alone so that no byte of a file outside it is read; SQL's WHERE grammar over partition columns, values
compared as their column's type, null as SQL treats it; a bad filter or one naming another column is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from samplecache_service.cli.status import format_status
from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.filters import FilterError, parse_filter
from samplecache_service.remote.stores import FsspecRemote, RemoteError
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.writer import Writer

TYPES = {"lang": pa.string(), "year": pa.int32(), "day": pa.date32()}


@pytest.mark.parametrize("text, values, want", [
    ("lang in ('en', 'de')", {"lang": "en"}, True),
    ("lang IN ('en', 'de')", {"lang": "fr"}, False),
    ("lang not in ('en')", {"lang": "fr"}, True),
    ("lang = 'en' and year >= 2024", {"lang": "en", "year": "2024"}, True),
    ("lang = 'en' AND year >= 2024", {"lang": "en", "year": "2023"}, False),
    ("year > 9 or lang == 'x'", {"lang": "x", "year": "10"}, True),  # 10 > 9 as numbers, not as text
    ("year > 9", {"year": "10"}, True),
    ("day >= '2024-01-01'", {"day": "2024-05-01"}, True),  # the literal cast to the column's type (date32)
    ("day < '2024-01-01'", {"day": "2024-05-01"}, False),
    ("lang <> 'en'", {"lang": "de"}, True),
    ("lang != 'en'", {"lang": None}, False),  # a comparison with null is not true
    ("lang is null", {"lang": None}, True),
    ("lang IS NOT NULL", {"lang": None}, False),
    ("not (lang = 'en')", {"lang": "de"}, True),
    ("lang = 'it''s'", {"lang": "it's"}, True),  # SQL's quote in a literal
    ("lang = 'a and b = c'", {"lang": "a and b = c"}, True),  # keywords inside a literal are text
])
def test_filters_match_as_sql_does(text: str, values: dict[str, str | None], want: bool) -> None:
    assert parse_filter(text).matches(values, TYPES) is want


@pytest.mark.parametrize("text, why", [
    ("lang in ('en'", "cannot be parsed"),
    ("__import__('os').system('x')", "is not a partition column, a literal or a comparison"),
    ("lang = other.attr", "is not a partition column"),
    ("lang + 'x' = 'y'", "is not a partition column"),
])
def test_what_is_not_a_filter_is_refused(text: str, why: str) -> None:
    with pytest.raises(FilterError, match=why):
        parse_filter(text)


def _table(tmp_path: Path) -> Path:
    """Hive folders; the files of lang=fr are not Parquet at all: reading a byte of one would quarantine it."""
    src = tmp_path / "src"
    for k, lang in enumerate(["en", "de", "fr"]):
        for year in (2023, 2024):
            folder = src / f"lang={lang}" / f"year={year}"
            folder.mkdir(parents=True)
            if lang == "fr":
                (folder / "part-0.parquet").write_bytes(b"not parquet" * 100)
            else:
                pq.write_table(pa.table({"id": pa.array([k * 10 + year % 10], pa.int64())}),
                               folder / "part-0.parquet")
    return src


def test_files_outside_the_filter_are_never_read(tmp_path: Path, cache: tuple[Catalog, Writer],
                                                 idle_status: Callable[..., dict[str, Any]]) -> None:
    catalog, writer = cache
    src = _table(tmp_path)
    remote = FsspecRemote(f"file://{src}")
    disc = Discovery(remote, catalog, writer, None, partition_filter="lang in ('en', 'de') and year >= 2024")
    assert len(disc.run()) == 2
    files = catalog.files()
    assert sorted(i.partitions["lang"] for i in files.values()) == ["de", "en"]
    assert all(i.partitions["year"] == "2024" and not i.quarantined for i in files.values())
    read = remote.bytes_read
    assert 0 < read <= sum(Path(p).stat().st_size for p in files)  # the two files' footers, nothing of the rest
    listing = disc.listing()
    assert listing is not None and listing["outside_filter"] == 4 and listing["parquet"] == 6
    assert listing["filter"] == "lang in ('en', 'de') and year >= 2024"
    status = idle_status(files=listing)
    rows = {line.split("  ")[0].strip(): line for line in format_status(status).splitlines()}
    assert rows["files"].endswith("6 Parquet files; --filter lang in ('en', 'de') and year >= 2024 leaves out 4")


def test_a_narrower_filter_on_a_warm_cache_takes_files_out(tmp_path: Path, cache: tuple[Catalog, Writer]) -> None:
    catalog, writer = cache
    src = _table(tmp_path)
    Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None, partition_filter="lang != 'fr'").run()
    assert len(catalog.files()) == 4
    # the daemon restarted with a narrower filter on the same cache dir: the files it leaves out are never
    # sampled again and no new epoch names their shards (as files that left a table)
    # (this source's own: the files stay live in the catalog for any other source of the table)
    disc = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None, partition_filter="lang = 'en'")
    disc.run()
    assert disc.removed_now == 0  # none left the table: the scheduler evicts this source's shards outside it
    files = catalog.files()
    assert sorted(files[p].partitions["lang"] for p in disc.outside_files if p in files) == ["de", "de"]
    assert not any(i.removed for i in files.values()) and len(disc.outside_files) == 4  # de and the fr ones
    # and back with the wider one: they are this source's again
    wide = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None, partition_filter="lang != 'fr'")
    wide.run()
    assert wide.removed_now == 0 and all(files[p].partitions["lang"] == "fr" for p in wide.outside_files
                                         if p in files) and len(wide.outside_files) == 2


@pytest.mark.parametrize("text, why", [("colour = 'red'", r"names \['colour'\], which are not partition columns"),
                                       ("lang = 'xx'", "no file of source .* is inside --filter"),
                                       ("year = 'abc'", "is not a int32")])
def test_a_filter_that_selects_nothing_or_names_another_column_is_refused(
        tmp_path: Path, cache: tuple[Catalog, Writer], text: str, why: str) -> None:
    catalog, writer = cache
    disc = Discovery(FsspecRemote(f"file://{_table(tmp_path)}"), catalog, writer, None, partition_filter=text)
    with pytest.raises(RemoteError, match=why):
        disc.run()
    assert catalog.files() == {}
