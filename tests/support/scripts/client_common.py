"""Shared by the client test modules (test_client_*.py): one awkward dataset on S3 and a fully cached daemon.

The dataset is the typed table of ``parquet_data.py``: 3 files x 397 rows, row groups of 61 (7 row groups a
file, the last one 31 rows): 21 remote units, 1191 samples. 1191 is odd and prime to every batch size used
here, so padding, dropping and short last batches are always exercised.

Each test module starts one daemon (module-scoped fixture), waits until every sample is cached, then seals
epochs 0 .. ``PRESEALED - 1`` up front (every manifest holds all 1191 samples, so any test may read any of them
in any order, read-only).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from parquet_data import write_dataset  # noqa: E402

from samplecache.format.manifest import unpack_shard_table  # noqa: E402
from samplecache.format.record import BlockView, Schema, record_key  # noqa: E402
from samplecache.reading.blocks.reader import open_cache  # noqa: E402
from samplecache_tools.launch import DaemonProcess  # noqa: E402

FILES, ROWS_PER_FILE, ROW_GROUP = 3, 397, 61
TOTAL = FILES * ROWS_PER_FILE  # 1191
UNITS = FILES * -(-ROWS_PER_FILE // ROW_GROUP)  # 21
PREFIX = "client-odd-397"
PRESEALED = 12  # epochs 0..11 sealed by the fixture


@dataclass
class OddDataset:
    url: str
    table: pa.Table
    total: int = TOTAL


def upload(s3: Any, bucket: str) -> OddDataset:
    prefix = f"{bucket}/{PREFIX}"
    table = write_dataset(s3.fs(), prefix, FILES, ROWS_PER_FILE, ROW_GROUP, seed=397)
    assert table.num_rows == TOTAL
    return OddDataset(url=f"s3://{prefix}", table=table)


def get_json(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def cached_daemon(s3: Any, dataset: OddDataset, workdir: Path, timeout: float = 90.0) -> Iterator[DaemonProcess]:
    """A daemon on ``dataset`` with every sample cached and epochs 0..PRESEALED-1 sealed; stopped afterwards."""
    d = DaemonProcess(dataset.url, workdir / "cache", extra=["--samplers", "2"], env=s3.env(),
                      log_path=workdir / "daemon.log")
    try:
        d.start(timeout=60)
        deadline = time.monotonic() + timeout
        while True:
            st = get_json(d.url + "/v1/status")
            if st["samples"] >= TOTAL:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"daemon cached {st['samples']}/{TOTAL} samples in {timeout} s:\n{d.log_tail()}")
            time.sleep(0.1)
        assert st["samples"] == TOTAL and st["shards"] == UNITS, st
        assert st["last_epoch"] == -1, "an epoch was sealed before the whole dataset was cached"
        for e in range(PRESEALED):
            m = get_json(f"{d.url}/v1/epochs/{e}")
            assert m["samples"] == TOTAL, m["samples"]
        yield d
    finally:
        d.stop()


def manifest_order_ids(manifest: dict[str, Any]) -> list[int]:
    """The ``id`` of every sample in manifest order (shards as listed, rows 0..n-1), read straight from LMDB with
    the record module: independent of the client's partition/stream/reader code."""
    schema = Schema.from_json(manifest["schema"])
    ci = schema.index("id")
    # The process's one handle on the environment (LMDB must not be opened twice in one process).
    env, db = open_cache(manifest["lmdb_path"], int(manifest["map_size"]), manifest.get("cache_id", ""))
    out: list[int] = []
    with env.begin() as txn:
        table = (unpack_shard_table(manifest["shards_packed"]) if "shards_packed" in manifest
                 else manifest["shards"])  # the client fetches the compact form
        for sid, rows, _bytes, rpb in (map(int, entry) for entry in table):
            got: list[int] = []
            for b in range(-(-rows // rpb)):
                buf = txn.get(record_key(int(sid), b), db=db)
                assert buf is not None, f"shard {sid} block {b} missing"
                got.extend(int(v) for v in np.asarray(BlockView(buf, schema).column_array(ci)))
            assert len(got) == rows
            out.extend(got)
    return out


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for test subprocesses: few threads (2-core machine), loopback gloo."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env
