"""Files the daemon skips: a listing's files that are not Parquet (README.txt, data.csv, _SUCCESS) are counted and
named, in the discovery log line (once per change), in /v1/status' ``files`` and in ``samplecache status``; a
source with none but such files names them in its refusal. A file:// source (unit tests)."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from samplecache_service.cli.status import format_status
from samplecache_service.http.models import FilesListed
from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.stores import FsspecRemote, RemoteError
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.writer import Writer


def _source(tmp_path: Path, parquet: int, others: list[str]) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True, exist_ok=True)
    for i in range(parquet):
        pq.write_table(pa.table({"id": pa.array([i], pa.int64())}), src / f"part-{i}.parquet")
    for name in others:
        (src / name).write_text("not parquet\n")
    return src


def _discovered(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "files_discovered"]


def test_other_files_are_counted_and_named_once_per_change(tmp_path: Path, cache: tuple[Catalog, Writer],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    catalog, writer = cache
    src = _source(tmp_path, 3, ["README.txt", "data.csv"])
    disc = Discovery(FsspecRemote(f"file://{src}"), catalog, writer, None)
    assert disc.listing() is None  # not listed yet
    with caplog.at_level(logging.INFO, logger="samplecache.discovery"):
        assert len(disc.run()) == 3
        disc.run()  # nothing changed: no line
        (src / "sub" / "_SUCCESS").write_text("")
        disc.run()
    lines = _discovered(caplog)
    assert len(lines) == 2, lines
    assert lines[0].endswith("3 Parquet file(s), 3 new; 2 other file(s) skipped: README.txt, data.csv"), lines[0]
    assert lines[1].endswith("3 Parquet file(s), 0 new; 3 other file(s) skipped: README.txt, data.csv, "
                             "sub/_SUCCESS"), lines[1]
    got = disc.listing()
    assert got is not None and got["parquet"] == 3 and got["skipped"] == 3
    files = FilesListed(**got)  # what /v1/status carries
    assert files.skipped_text == "3 other file(s) skipped: README.txt, data.csv, sub/_SUCCESS"


def test_samplecache_status_says_how_many_files_were_skipped() -> None:
    status = {"source": "s3://b/d/", "cache_dir": "/c", "bytes": 0, "max_bytes": 1, "samples": 0, "shards": 0,
              "disk_free": 1, "sampler": {"state": "sampling", "reason": None, "processes": 1, "in_flight": 0},
              "ingest": {"samples_per_s": 0.0, "bytes_per_s": 0.0}, "remote": {"bytes_read": 0,
                                                                               "bytes_since_last_epoch": 0},
              "pacing": {"mode": "epoch", "replace_per_epoch": 1.0, "max_ingest_rate": 0, "reason": None},
              "jobs": 0, "coverage": None, "epochs_sealed": 0, "last_epoch": -1, "remote_errors": 0,
              "last_error": None, "quarantined": [], "epochs": [],
              "files": {"parquet": 3, "skipped": 2, "skipped_text": "2 other file(s) skipped: README.txt, data.csv",
                        "listed_at": 1.0}}
    rows = {line.split("  ")[0].strip(): line for line in format_status(status).splitlines()}
    assert rows["files"].endswith("3 Parquet files, 2 other file(s) skipped: README.txt, data.csv"), rows
    rows = {line.split("  ")[0].strip(): line for line in format_status({**status, "files": None}).splitlines()}
    assert rows["files"].split() == ["files", "-"]  # not listed yet


def test_a_source_of_only_other_files_names_them(tmp_path: Path) -> None:
    src = _source(tmp_path, 0, ["README.txt", "data.csv"])
    with pytest.raises(RemoteError, match=r"no Parquet files .* \(2 other file\(s\) skipped: README.txt, data.csv\)"):
        FsspecRemote(f"file://{src}").list_files()
