"""A seal names the shards of the sources its manifest has entries for: a source that became ready between the
manifest's fields and the choice of shards (its first listing ended while the seal queued) waits for the next."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from samplecache.format.manifest import Manifest
from samplecache_service.epochs.jobs import JobTable
from samplecache_service.epochs.leases import LeaseTable
from samplecache_service.epochs.manager import EpochManager, EpochRules
from samplecache_service.store.budget import Budget
from samplecache_service.store.catalog import Catalog, Shard, u64
from samplecache_service.store.lmdbmap import open_env
from samplecache_service.store.writer import Writer


def test_a_seal_names_only_the_sources_its_fields_have_entries_for(tmp_path: Path) -> None:
    env, dbs = open_env(tmp_path / "lmdb", 1 << 26)
    catalog = Catalog(env, dbs)
    writer = Writer(env, dbs, catalog)
    try:
        shards = [Shard(id=i, key=f"k{i}", path=f"{src}/a.parquet", row_group=i, unit=i, cycle=0, rows=10,
                        bytes=1000, rows_per_block=10, blocks=1, created=time.time(), source=src)
                  for i, src in enumerate(["web", "code", "web", "code"], start=1)]

        def op(txn: Any) -> None:
            for s in shards:
                txn.put(u64(s.id), s.to_json(), db=dbs[b"shards"], append=True)
        writer.submit(op, lambda _: [catalog.added_shard(s) for s in shards]).result()
        entry = {"schema": {"columns": []}, "url": "s3://b/", "skipped_columns": {}}
        fields: dict[str, Any] = {"schema": {"columns": []}, "lmdb_path": "x", "skipped_columns": {},
                                  "map_size": 1 << 26, "seed": 0, "source": "s3://b/web/", "cache_id": "",
                                  "sources": {"web": entry}, "remote_bytes": 0}
        epochs = EpochManager(catalog, writer, LeaseTable(default_ttl=60.0), JobTable(60.0),
                              Budget(1 << 26, 0, "fifo"), lambda: json.loads(json.dumps(fields)), EpochRules(),
                              shares=lambda: {"web": 0.5, "code": 0.5})  # code is ready by the shards' choice

        def sealed(epoch: int) -> Manifest:
            return Manifest.from_json(json.loads(asyncio.run(epochs.manifest(epoch, timeout=5))))

        first = sealed(0)
        assert first.source_names() == ["web"] and first.table()[:, 0].tolist() == [1, 3]
        fields["sources"]["code"] = entry  # the next seal's fields have code's entry: it is named
        second = sealed(1)
        assert second.source_names() == ["code", "web"] and second.table()[:, 0].tolist() == [1, 2, 3, 4]
        assert second.source_of().tolist() == [1, 0, 1, 0]
        assert np.array_equal(np.sort(second.table()[:, 0]), second.table()[:, 0])
    finally:
        writer.close()
        env.close()
