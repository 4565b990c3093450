"""Reading a daemon's epoch back in tests and checking it against the Parquet it came from: every row once, every
cell as pyarrow reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from arrow_compare import assert_cells_equal
from torch.utils.data import DataLoader

from samplecache import SampleCacheDataset


def keep(sample: Any) -> Any:
    """collate_fn that hands samples through untouched."""
    return sample


def upload(s3: Any, local: Path, remote: str) -> None:
    s3.fs().pipe(remote, local.read_bytes())


def by_id(samples: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    ids = [int(s["id"]) for s in samples]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} samples delivered twice"
    return {i: s for i, s in zip(ids, samples)}


def compare_table(got: dict[int, dict[str, Any]], table: pa.Table, where: str) -> None:
    """Every row of ``table`` was served once, and every served cell equals pyarrow's (per id)."""
    table = table.sort_by("id")
    ids = table.column("id").to_pylist()
    assert sorted(got) == ids, (f"{where}: served {len(got)} ids, want {len(ids)}; missing "
                                f"{sorted(set(ids) - set(got))[:5]}, extra {sorted(set(got) - set(ids))[:5]}")
    for name in table.column_names:
        assert all(sorted(got[i]) == sorted(table.column_names) for i in ids[:1]), (
            f"{where}: columns {sorted(got[ids[0]])} != {sorted(table.column_names)}")
        assert_cells_equal([got[i][name] for i in ids], table.column(name).combine_chunks(), f"{where} {name}")


def read_epoch(url: str, rows: int, workers: int = 2) -> list[dict[str, Any]]:
    """One epoch, sample by sample, through a plain DataLoader with worker processes."""
    ds = SampleCacheDataset(url, min_samples=rows, wait=60)
    try:
        return list(DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=keep))
    finally:
        ds.close()
