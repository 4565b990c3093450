"""End to end, a failed start never breaks the next one (issue 10, item 7). ``serve`` fails (exit 1, one line
naming why) with a column the source lacks (``--columns id,nope``: nothing recorded but the cache dir's stamp)
or with a pinned schema no file fits (every file recorded, quarantined); then the same cache dir starts with good
flags into a daemon whose scheduler runs: ``/readyz`` and ``/healthz`` 200, every row group of the session's
typed dataset sampled into shards. (Before issue 10 the second daemon's scheduler thread died on an
``AssertionError`` and ``/readyz`` answered 503 forever.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import lmdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from samplecache_service.store.catalog import DBS

pytestmark = pytest.mark.e2e


def cache_state(lmdb_dir: Path) -> tuple[int, Any, bool]:
    """(files recorded, the stamped source, whether a schema is stored) of a cache no daemon has open."""
    env = lmdb.open(str(lmdb_dir), readonly=True, lock=False, max_dbs=len(DBS) + 2, subdir=True)
    try:
        files, meta = env.open_db(b"files"), env.open_db(b"meta")
        with env.begin() as txn:
            source = txn.get(b"source", db=meta)
            return (txn.stat(files)["entries"], json.loads(source) if source else None,
                    txn.get(b"schema", db=meta) is not None)
    finally:
        env.close()


def bad_columns(tmp_path: Path, url: str, columns: list[str]) -> tuple[list[str], str, bool]:
    """``--columns id,nope``: discovery stops before it records any file."""
    return (["--columns", "id,nope"], f"columns ['nope'] are not in the source schema {columns}", False)


def bad_schema_file(tmp_path: Path, url: str, columns: list[str]) -> tuple[list[str], str, bool]:
    """A pinned schema no file fits (id as string): every file is recorded, quarantined with kind schema."""
    path = tmp_path / "schema.parquet"
    pq.write_table(pa.schema([pa.field("id", pa.string())]).empty_table(), path)
    return (["--schema-file", str(path)], f"no readable Parquet file under source {url!r}: schema: column 'id' "
            f"is int64 in this file and string in the dataset's schema", True)


@pytest.mark.parametrize("failing", [bad_columns, bad_schema_file], ids=["columns-id-nope", "schema-file-no-fit"])
def test_restart_after_a_failed_start_on_the_same_cache_dir(daemon: Any, typed_dataset: Any, tmp_path: Path,
                                                            get: Callable[..., Any], until: Callable[..., Any],
                                                            failing: Callable[..., Any]) -> None:
    cache = tmp_path / "cache"
    columns = typed_dataset.table.column_names
    assert "nope" not in columns and "id" in columns
    flags, message, records_files = failing(tmp_path, typed_dataset.url, columns)

    bad = daemon(cache_dir=cache, extra=flags, ready=False)
    code = bad.proc.wait(60)
    out = bad.log_tail(20000)
    assert code == 1, f"exit code {code}:\n{out}"
    # one line that names the cause (for --columns: the absent column and all the source's columns)
    line = next((ln for ln in out.splitlines() if ln.startswith("samplecache serve: ")), "")
    assert message in line, out
    # what the failed start left: the cache dir stamped with the source, no schema, and maybe the files
    recorded, source, has_schema = cache_state(cache / "lmdb")
    assert source == typed_dataset.url and not has_schema, (source, has_schema)
    assert recorded == (typed_dataset.files if records_files else 0), recorded

    good = daemon(cache_dir=cache)  # waits for /healthz
    r = until(lambda: (lambda x: x if x.status == 200 else None)(get(good.url + "/readyz")), 30, "/readyz 200")
    assert r.json() == {"ok": True}, r.body
    s = until(lambda: (lambda st: st if (st.get("coverage") or {}).get("units_sampled") == typed_dataset.row_groups
                       else None)(get(good.url + "/v1/status").json()), 90, "every row group sampled")
    assert s["coverage"]["units"] == typed_dataset.row_groups, s["coverage"]
    assert s["last_error"] is None and not s["quarantined"], s
    shards = get(good.url + "/v1/shards?limit=1000").json()
    assert shards["total"] >= typed_dataset.row_groups, shards
    assert sum(x["rows"] for x in shards["shards"]) == typed_dataset.rows, shards
    schema = get(good.url + "/v1/schema").json()
    assert [c["name"] for c in schema["columns"]] == columns, schema

    # the scheduler keeps running: a while later both probes still answer 200
    time.sleep(2)
    for probe in ("/readyz", "/healthz"):
        r = get(good.url + probe)
        assert r.status == 200, f"{probe}: {r.status} {r.body!r}\n{good.log_tail()}"
    assert "AssertionError" not in good.log_tail(100000) and "Traceback" not in good.log_tail(100000)
