"""End to end, the daemon's first planning line (event ``source_planned``) counts row groups and units apart:
consecutive tiny row groups are read together as one unit, so "row groups" alone was the wrong word for the
units it counted (issue 10's note: "1 files, 6 row groups" for a file of 10,000 row groups)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.e2e


def test_the_planning_line_names_row_groups_and_units(daemon: Any, s3: Any, prefix: str, tmp_path: Path,
                                                      get: Callable[..., Any], until: Callable[..., Any]) -> None:
    # tiny.parquet: 200 row groups of 5 rows (more than 64: read together); small.parquet: 3 (one unit each)
    layout = {"tiny.parquet": (200, 5), "small.parquet": (3, 40)}
    for name, (groups, per) in layout.items():
        n = groups * per
        path = tmp_path / name
        pq.write_table(pa.table({"id": pa.array(range(n), pa.int64()), "v": pa.array(range(n), pa.int32())}), path,
                       row_group_size=per)
        assert pq.ParquetFile(path).metadata.num_row_groups == groups
        s3.fs().pipe(f"{prefix}/{name}", path.read_bytes())

    d = daemon(source=f"s3://{prefix}")
    status = until(lambda: (lambda s: s if s.get("coverage") else None)(get(d.url + "/v1/status").json()), 30,
                   "the source planned")
    units = status["coverage"]["units"]
    assert 3 < units < 203 - 10, status["coverage"]  # the tiny row groups were merged into a few units

    lines = [ln for ln in d.log_tail(200000).splitlines() if re.search(r"source s3://\S+: \d+ files", ln)]
    assert len(lines) == 1, lines
    assert lines[0].endswith(f"source s3://{prefix}: 2 files, 203 row groups in {units} units "
                             f"({units} units on this node)"), lines[0]
