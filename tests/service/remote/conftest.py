"""The cache the remote tests discover into (a real LMDB catalog and its writer under the test's tmp_path), and the
least `/v1/status` answer that `samplecache status` formats, for the rows a test adds to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from samplecache_service.store.catalog import Catalog
from samplecache_service.store.lmdbmap import open_env
from samplecache_service.store.writer import Writer


@pytest.fixture()
def cache(tmp_path: Path) -> Iterator[tuple[Catalog, Writer]]:
    env, dbs = open_env(tmp_path / "lmdb", 1 << 28)
    catalog = Catalog(env, dbs)
    writer = Writer(env, dbs, catalog)
    try:
        yield catalog, writer
    finally:
        writer.close()
        env.close()


@pytest.fixture()
def idle_status() -> Callable[..., dict[str, Any]]:
    """A /v1/status answer of an idle, empty daemon on ``s3://b/t/``, with ``fields`` over it."""
    def make(**fields: Any) -> dict[str, Any]:
        return {"source": "s3://b/t/", "cache_dir": "/c", "bytes": 0, "max_bytes": 1, "samples": 0, "shards": 0,
                "disk_free": 1, "sampler": {"state": "sampling", "reason": None, "processes": 1, "in_flight": 0},
                "ingest": {"samples_per_s": 0.0, "bytes_per_s": 0.0},
                "remote": {"bytes_read": 0, "bytes_since_last_epoch": 0},
                "pacing": {"mode": "epoch", "replace_per_epoch": 1.0, "max_ingest_rate": 0, "reason": None},
                "jobs": 0, "coverage": None, "epochs_sealed": 0, "last_epoch": -1, "remote_errors": 0,
                "last_error": None, "quarantined": [], "epochs": [], "files": None, **fields}
    return make
