"""What a source's units give a reader, without a daemon: every unit the scheduler would still sample (files live in
the table, not quarantined), run through the real sampling task and decoded from its staging files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from samplecache.format.record import decode_rows
from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.planner import build_units
from samplecache_service.sampling.sampler import SampleTask, run_task
from samplecache_service.store.catalog import Catalog
from samplecache_service.store.staging import read_staged


def served(disc: Discovery, catalog: Catalog, tmp_path: Path) -> list[dict[str, Any]]:
    """Every row of every unit still sampled, as a sampler stages it and a reader decodes it, sorted by ``id``; each
    staging file's provenance names its file's partition values."""
    assert disc.schema is not None
    staging = tmp_path / "staging"
    staging.mkdir(exist_ok=True)
    files = catalog.files()
    out: list[dict[str, Any]] = []
    for n, unit in enumerate(build_units(files)):
        info = files[unit.path]
        if info.removed or info.quarantined:
            continue
        source = getattr(disc.remote, "data_url", disc.remote.url)  # a catalog's table: where its files lie
        r = run_task(SampleTask(key=f"t{n}", source=source, storage_options={}, path=unit.path,
                                row_group=unit.row_group, schema=disc.schema.to_json(), staging_dir=str(staging),
                                block_bytes=1 << 20, arrow_schema=disc.target_text(), file_size=info.size or 0,
                                footer_bytes=info.footer or 0, partitions=dict(info.partitions)))
        assert r.ok, r.error
        for staged_path, _ in r.parts:
            staged = read_staged(Path(staged_path))
            assert staged.header["partitions"] == info.partitions
            for block in staged.blocks:
                out.extend(decode_rows(block, disc.schema))
            staged.close()
            Path(staged_path).unlink()
    return sorted(out, key=lambda r: r["id"])
