"""End to end, tables as data lakes store them (issue 23): Hive-partitioned folders, Delta Lake tables. Each test
writes its table under a unique prefix of the real S3 server and starts a real daemon subprocess on it; every epoch
is checked row by row against what pyarrow.dataset (or the table's own reader) reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from epoch_check import by_id, compare_table, read_epoch, upload

pytestmark = pytest.mark.e2e

# Spark's folders: nested keys, a URL-encoded value, a null (__HIVE_DEFAULT_PARTITION__)
HIVE_FOLDERS = ["lang=en/year=2023", "lang=en/year=2024", "lang=d%2Fe%20f/year=2024",
                "lang=__HIVE_DEFAULT_PARTITION__/year=2024"]


def test_hive_partition_columns_are_served(daemon: Any, s3: Any, prefix: str, tmp_path: Path,
                                           get: Callable[..., Any]) -> None:
    local = tmp_path / "hive"
    rows = 0
    for k, folder in enumerate(HIVE_FOLDERS):
        (local / folder).mkdir(parents=True)
        t = pa.table({"id": pa.array(range(rows, rows + 40), pa.int64()), "x": pa.array([k * 0.5] * 40)})
        pq.write_table(t, local / folder / "part-00000.parquet", row_group_size=20)
        upload(s3, local / folder / "part-00000.parquet", f"{prefix}/{folder}/part-00000.parquet")
        rows += 40
    (local / "_SUCCESS").write_text("")
    upload(s3, local / "_SUCCESS", f"{prefix}/_SUCCESS")
    want = pads.dataset(local, format="parquet", partitioning="hive", exclude_invalid_files=True).to_table()
    assert want.schema.field("year").type == pa.int32() and want.num_rows == rows

    d = daemon(source=f"s3://{prefix}")
    schema = get(d.url + "/v1/schema").json()
    assert [c["name"] for c in schema["columns"]] == ["id", "x", "lang", "year"], schema
    cols = {c["name"]: (c["kind"], c["dtype"]) for c in schema["columns"]}
    assert cols["lang"] == ("string", None) and cols["year"] == ("fixed", "<i4"), cols
    compare_table(by_id(read_epoch(d.url, rows)), want, "hive partitions")
    # each shard names its file's partition values (its provenance)
    shards = get(d.url + "/v1/shards?limit=1000").json()["shards"]
    assert {(s["partitions"]["lang"], s["partitions"]["year"]) for s in shards} == {
        ("en", "2023"), ("en", "2024"), ("d/e f", "2024"), (None, "2024")}, shards
    assert all(s["partitions"]["lang"] == "en" for s in shards if "/lang=en/" in s["path"])
