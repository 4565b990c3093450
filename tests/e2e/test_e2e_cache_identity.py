"""End to end, the cache dir removed or replaced under a running daemon (issue 21, item 1), with real ``samplecache
serve`` subprocesses against the real S3 server (conftest.py):

- ``rm -rf`` of an idle daemon's cache dir: ``/healthz`` answers 503 naming it within seconds, and the daemon
  exits non-zero (its service manager restarts it), where it used to stay up, 200, writing into unlinked files;
- the cache dir removed and a second daemon started on the same path (the lock file went with the dir): a client
  reading the first daemon's manifest gets the identity error naming both caches, never the new cache's rows
  under the old shard ids (which restart at 1); the new daemon's manifest reads.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from samplecache.api.client import fetch_manifest
from samplecache.reading.blocks.reader import CacheReplaced
from samplecache.reading.epoch_source import EpochPlan

pytestmark = pytest.mark.e2e

EXIT_WITHIN_S = 20.0  # two looks 2 s apart, then a clean shutdown


def read_ids(plan: EpochPlan, shard_index: int = 0) -> list[int]:
    """The ``id`` of every row of the plan's ``shard_index``-th shard, read as the client reads."""
    rows = int(plan.rows[shard_index])
    n = np.full(rows, 1, np.int64)
    got = plan.reader.batch(n * plan.ids[shard_index], n * plan.rows_per_block[shard_index],
                            np.arange(rows, dtype=np.int64), [plan.schema.index("id")])
    return [int(v) for v in got["id"]]


def exited(d: Any) -> int:
    code = d.proc.wait(EXIT_WITHIN_S)
    assert code != 0, f"the daemon exited 0:\n{d.log_tail()}"
    return int(code)


def test_rm_rf_of_an_idle_daemons_cache_dir_is_a_503_and_an_exit(daemon: Callable[..., Any], tmp_path: Path,
                                                                   typed_dataset: Any, get: Callable[..., Any],
                                                                   until: Callable[..., Any]) -> None:
    cache = tmp_path / "cache"
    d = daemon(cache_dir=cache, samplers=1)
    manifest = fetch_manifest(d.url, 0, 1, 60.0, d.token)
    assert re.fullmatch(r"[0-9a-f]{32}", manifest["cache_id"]), manifest["cache_id"]
    st = until(lambda: (lambda s: s if (s.get("coverage") or {}).get("units_sampled") == typed_dataset.row_groups
                        and s["sampler"]["state"] == "paused" else None)(get(d.url + "/v1/status").json()), 90,
               "the daemon to go idle (the whole small dataset cached)")
    print(f"\nidle: {st['sampler']['reason']}")
    time.sleep(4.5)  # two looks at an intact cache dir: no false alarm
    assert get(d.url + "/healthz").status == 200

    shutil.rmtree(cache)
    t0 = time.monotonic()
    r = until(lambda: (lambda x: x if x.status != 200 else None)(get(d.url + "/healthz")), 10, "/healthz to fail")
    failed_after = time.monotonic() - t0
    assert r.status == 503 and f"the cache dir {cache} was removed" in r.json()["detail"], r.body
    code = exited(d)
    print(f"\n/healthz 503 {failed_after:.1f} s after rm -rf; exit {code} after {time.monotonic() - t0:.1f} s")
    log = d.log_tail(100_000)
    assert code == 1 and f"samplecache serve: stopped: the cache dir {cache} was removed" in log, log


def test_a_manifest_of_a_replaced_cache_is_refused_by_the_client(daemon: Callable[..., Any], tmp_path: Path,
                                                                  typed_dataset: Any) -> None:
    cache = tmp_path / "cache"
    first = daemon(cache_dir=cache, samplers=1)
    old = fetch_manifest(first.url, 0, 1, 60.0, first.token)
    shutil.rmtree(cache)
    second = daemon(cache_dir=cache, samplers=1)  # the lock file is gone: nothing stops it
    new = fetch_manifest(second.url, 0, 1, 60.0, second.token)
    assert old["cache_id"] != new["cache_id"] and old["lmdb_path"] == new["lmdb_path"]
    assert EpochPlan(new, None).ids[0] == EpochPlan(old, None).ids[0] == 1  # the same shard ids, another cache

    with pytest.raises(CacheReplaced) as info:
        read_ids(EpochPlan(old, None))
    msg = str(info.value)
    assert f"the manifest names cache {old['cache_id']}, this process reads cache {new['cache_id']}" in msg, msg
    assert "Restart the samplecache daemon" in msg, msg
    ids = read_ids(EpochPlan(new, None))
    assert ids and all(i in typed_dataset.by_id for i in ids)
    assert exited(first) == 1
    assert second.proc.poll() is None
