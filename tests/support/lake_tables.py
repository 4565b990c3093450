"""Lake tables for tests: Delta Lake tables written, changed and read by delta-rs (``deltalake``).

Writes run in a subprocess: the process that ran ``write_deltalake`` may abort at exit after the table is written
(TESTING.md), so a test checks the table, not the writer's exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

_WRITE = """
import json, sys
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
uri, what, arg, opts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]) or None
if what == "delete":
    DeltaTable(uri, storage_options=opts).delete(arg)
elif what == "optimize":
    DeltaTable(uri, storage_options=opts).optimize.compact()
else:
    spec = json.loads(arg)
    table = pa.ipc.open_file(spec["data"]).read_all()
    write_deltalake(uri, table, mode=what, partition_by=spec["partition_by"] or None, storage_options=opts)
"""


def s3_options(s3: Any) -> dict[str, str]:
    """delta-rs options for the test S3 server (plain HTTP on loopback)."""
    return {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": s3.key, "AWS_SECRET_ACCESS_KEY": s3.secret,
            "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true", "AWS_REGION": "us-east-1"}


def _run(uri: str, what: str, arg: str, options: dict[str, str] | None) -> None:
    subprocess.run([sys.executable, "-c", _WRITE, uri, what, arg, json.dumps(options or {})], check=False,
                   timeout=120, capture_output=True)


def write_delta(uri: str, table: pa.Table, tmp: Path, mode: str = "append", partition_by: list[str] | None = None,
                options: dict[str, str] | None = None) -> int:
    """Write ``table`` to the Delta table at ``uri`` (``mode``: append | overwrite); returns the new version."""
    before = version(uri, options)
    data = tmp / f"delta-write-{before + 1}.arrow"
    with pa.ipc.new_file(data, table.schema) as w:
        w.write_table(table)
    _run(uri, mode, json.dumps({"data": str(data), "partition_by": partition_by}), options)
    data.unlink()
    after = version(uri, options)
    assert after > before, f"the Delta write to {uri} did not commit (version {after})"
    return after


def delete_delta(uri: str, predicate: str, options: dict[str, str] | None = None) -> int:
    """Delete the rows matching ``predicate`` (delta-rs rewrites their files); returns the new version."""
    before = version(uri, options)
    _run(uri, "delete", predicate, options)
    after = version(uri, options)
    assert after > before, f"the Delta delete on {uri} did not commit"
    return after


def optimize_delta(uri: str, options: dict[str, str] | None = None) -> int:
    """Compact the table's small files into larger ones (delta-rs' optimize); returns the new version."""
    before = version(uri, options)
    _run(uri, "optimize", "", options)
    after = version(uri, options)
    assert after > before, f"optimize on {uri} did not commit"
    return after


def version(uri: str, options: dict[str, str] | None = None) -> int:
    from deltalake import DeltaTable

    try:
        return int(DeltaTable(uri, storage_options=options).version())
    except Exception:  # noqa: BLE001 - no table yet
        return -1


def live_rows(uri: str, options: dict[str, str] | None = None) -> pa.Table:
    """The table's rows as delta-rs reads them (the truth an epoch is checked against)."""
    from deltalake import DeltaTable

    return pa.table(DeltaTable(uri, storage_options=options).to_pyarrow_table())


def iceberg_catalog(tmp: Path, warehouse: str, properties: dict[str, str] | None = None) -> Any:
    """A pyiceberg SQL catalog on sqlite (no server) whose tables live under ``warehouse`` (file:// or s3://)."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("test", uri=f"sqlite:///{tmp / 'iceberg-catalog.db'}", warehouse=warehouse,
                         **(properties or {}))
    catalog.create_namespace_if_not_exists("ns")
    return catalog


def iceberg_s3_properties(s3: Any) -> dict[str, str]:
    return {"s3.endpoint": s3.endpoint, "s3.access-key-id": s3.key, "s3.secret-access-key": s3.secret,
            "s3.region": "us-east-1"}


_SPARK = """
import json, sys
from pyspark.sql import SparkSession
out, dump = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.sql.shuffle.partitions", "1").getOrCreate())
rows = json.loads(sys.argv[3])
df = spark.createDataFrame([tuple(r) for r in rows], "id long, x double, lang string, year int")
df.coalesce(1).write.partitionBy("lang", "year").parquet(out)
back = spark.read.parquet(out)
json.dump({"schema": back.schema.simpleString(), "rows": [r.asDict() for r in back.collect()]}, open(dump, "w"))
spark.stop()
"""


def spark_hive(out: Path, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """A Hive-partitioned dataset (by lang, year) written by Spark (local[1]) at ``out``, and Spark's own read of
    it back: {"schema": ..., "rows": [...]}."""
    dump = out.parent / f"{out.name}-spark.json"
    # no JVM perf-data file in /tmp/hsperfdata_<user>; Spark's scratch space under the test's dir
    env = {**os.environ, "JAVA_TOOL_OPTIONS": "-XX:-UsePerfData", "SPARK_LOCAL_DIRS": str(out.parent)}
    subprocess.run([sys.executable, "-c", _SPARK, str(out), str(dump), json.dumps(rows)], check=True, timeout=300,
                   capture_output=True, env=env)
    got: dict[str, Any] = json.loads(dump.read_text())
    dump.unlink()
    return got
