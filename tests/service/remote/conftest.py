"""The cache the remote tests discover into: a real LMDB catalog and its writer under the test's tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from samplecache_service.store.catalog import Catalog
from samplecache_service.store.writer import Writer, open_env


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
