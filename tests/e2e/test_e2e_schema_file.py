"""End to end, ``--schema-file`` (issue 10, item 4): a real daemon subprocess on the real S3 server, with the
dataset's schema pinned wider than its files. Every served cell equals pyarrow's reading of the files with that
schema; a file that cannot fit it is quarantined with kind ``schema``; a schema file that is not one stops
``serve`` with a line naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from epoch_check import by_id, compare_table, read_epoch, upload

pytestmark = pytest.mark.e2e

# wider than every file: x is int64/int32/double in the files, t is missing or all-null in some, ts is ms in one
PINNED = pa.schema([pa.field("id", pa.int64()), pa.field("x", pa.float64()), pa.field("t", pa.string()),
                    pa.field("ts", pa.timestamp("us", tz="UTC"))])


def drifted_files(n: int) -> dict[str, pa.Table]:
    rng = np.random.default_rng(4)
    return {
        # x int64 (big values: exact in float64), t strings with nulls, ts in ms, a column the schema does not have
        "a.parquet": pa.table({"id": pa.array(range(0, n), pa.int64()),
                               "x": pa.array(rng.integers(-2**40, 2**40, n), pa.int64()),
                               "t": pa.array([None if i % 4 == 0 else f"a{i}" for i in range(n)]),
                               "ts": pa.array(rng.integers(0, 2**41, n), pa.timestamp("ms", tz="UTC")),
                               "extra": pa.array([b"e"] * n)}),
        # x int32 with nulls, no t, no ts
        "b.parquet": pa.table({"id": pa.array(range(n, 2 * n), pa.int64()),
                               "x": pa.array([None if i % 9 == 0 else int(v) for i, v in
                                              enumerate(rng.integers(-1000, 1000, n))], pa.int32())}),
        # x double with NaN, t all None (Arrow null type), ts missing
        "c.parquet": pa.table({"id": pa.array(range(2 * n, 3 * n), pa.int64()),
                               "x": pa.array(np.where(np.arange(n) % 6 == 0, np.nan, rng.normal(size=n))),
                               "t": pa.nulls(n)}),
        # x as strings: cannot be unified with the pinned double
        "d.parquet": pa.table({"id": pa.array(range(3 * n, 4 * n), pa.int64()),
                               "x": pa.array([f"x{i}" for i in range(n)])}),
        # id as double: fits only by widening the pinned int64, which a pinned schema never does
        "e.parquet": pa.table({"id": pa.array(np.arange(4 * n, 5 * n, dtype=np.float64)),
                               "x": pa.array(rng.normal(size=n))}),
    }


def test_a_pinned_wider_schema_is_served_exactly_and_files_that_do_not_fit_are_quarantined(
        daemon: Any, s3: Any, prefix: str, tmp_path: Path, get: Callable[..., Any],
        until: Callable[..., Any]) -> None:
    n = 90
    local = tmp_path / "files"
    local.mkdir()
    for name, table in drifted_files(n).items():
        pq.write_table(table, local / name, row_group_size=30)
        upload(s3, local / name, f"{prefix}/{name}")
    schema_file = tmp_path / "schema.arrows"  # an Arrow IPC stream (the Parquet form is tested in unit tests)
    with pa.ipc.new_stream(schema_file, PINNED):
        pass

    good = [str(local / f) for f in ("a.parquet", "b.parquet", "c.parquet")]
    want = pads.dataset(good, schema=PINNED, format="parquet").to_table()
    assert want.schema.equals(PINNED) and want.num_rows == 3 * n
    assert want.column("t").null_count > n and want.column("ts").null_count == 2 * n  # filled with nulls
    # the files alone would unify to another schema: the pin makes ts microseconds and leaves "extra" out
    alone = pa.unify_schemas([pq.read_schema(p) for p in good], promote_options="permissive")
    assert alone.field("ts").type == pa.timestamp("ms", tz="UTC") and "extra" in alone.names

    d = daemon(source=f"s3://{prefix}", extra=["--schema-file", str(schema_file)])

    q = until(lambda: (lambda r: r if r["total"] >= 2 else None)(get(d.url + "/v1/quarantine").json()), 60,
              "d.parquet and e.parquet quarantined")
    assert q["total"] == 2 and q["by_kind"] == {"schema": 2}, q
    reasons = {Path(f["path"]).name: f["reason"] for f in q["files"]}
    assert sorted(reasons) == ["d.parquet", "e.parquet"], reasons
    assert all(f["kind"] == "schema" for f in q["files"]), q
    assert "column 'x' is string in this file and double" in reasons["d.parquet"], reasons
    assert ("column 'id' is double in this file; --schema-file has int64, which would have to become double"
            in reasons["e.parquet"]), reasons

    schema = get(d.url + "/v1/schema").json()
    assert [c["name"] for c in schema["columns"]] == PINNED.names, schema  # "extra" is not served
    cols = {c["name"]: (c["kind"], c["dtype"]) for c in schema["columns"]}
    assert cols["x"] == ("fixed", "<f8") and cols["id"] == ("fixed", "<i8"), cols
    assert cols["ts"][1] == "<M8[us]" and cols["t"][0] == "string", cols
    assert schema["arrow_schema"] == str(PINNED), schema["arrow_schema"]

    samples = read_epoch(d.url, 3 * n)
    got = by_id(samples)
    compare_table(got, want, "pinned schema")  # every row of a, b, c once; every cell as pyarrow reads it
    assert all(sorted(s) == sorted(PINNED.names) for s in samples)


def test_a_schema_file_that_is_not_one_stops_serve_naming_it(daemon: Any, tmp_path: Path) -> None:
    bad = tmp_path / "schema.csv"
    bad.write_text("id,x\n1,2.5\n")
    d = daemon(extra=["--schema-file", str(bad)], ready=False)
    assert d.proc.wait(60) == 1, d.log_tail()
    out = d.log_tail()
    assert f"samplecache serve: --schema-file {bad}: neither a Parquet nor an Arrow IPC file" in out, out
