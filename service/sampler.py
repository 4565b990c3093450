"""The sampling task: runs in a sampler subprocess, never in the daemon.

Reads one remote unit (a row group), encodes it into record blocks and writes a
staging file. Every outcome comes back as a ``SampleResult`` value.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from samplecache.record import Schema
from samplecache.service.encoder import encode_table
from samplecache.service.remote import FsspecRemote, classify_error
from samplecache.service.staging import write_staged

_REMOTES: dict[tuple[str, str], FsspecRemote] = {}


@dataclass(frozen=True)
class SampleTask:
    key: str                       # unique name: also the staging file name
    source: str
    storage_options: dict[str, Any]
    path: str
    row_group: int
    schema: dict[str, Any]
    staging_dir: str
    block_bytes: int
    unit: int = 0                  # position of the unit in the planner's unit table
    cycle: int = 0                 # sampling pass


@dataclass
class SampleResult:
    task: SampleTask
    ok: bool
    staged: str | None = None
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    error_kind: str | None = None  # 'unreachable' | 'transient' | 'corrupt'
    error: str | None = None
    remote_bytes: int = 0          # bytes fetched from the remote store for this task
    extra: dict[str, Any] = field(default_factory=dict)


def _remote(task: SampleTask) -> FsspecRemote:
    k = (task.source, repr(sorted(task.storage_options.items())))
    if k not in _REMOTES:
        _REMOTES[k] = FsspecRemote(task.source, task.storage_options)
    return _REMOTES[k]


def run_task(task: SampleTask) -> SampleResult:
    """Read, encode and stage one unit. Never raises."""
    t0 = time.perf_counter()
    remote = None
    before = 0
    try:
        remote = _remote(task)
        before = remote.bytes_read
        schema = Schema.from_json(task.schema)
        table = remote.read_row_group(task.path, task.row_group, schema.names)
        blocks, rows_per_block = encode_table(table, schema, task.block_bytes)
        header = {"key": task.key, "path": task.path, "row_group": task.row_group, "unit": task.unit,
                  "cycle": task.cycle, "rows": table.num_rows, "rows_per_block": rows_per_block}
        staged = write_staged(Path(task.staging_dir), task.key, header, blocks)
        return SampleResult(task=task, ok=True, staged=str(staged), rows=table.num_rows,
                            bytes=sum(len(b) for b in blocks), seconds=time.perf_counter() - t0,
                            remote_bytes=remote.bytes_read - before)
    except Exception as e:  # every failure is a value; the supervisor decides what to do
        return SampleResult(task=task, ok=False, error_kind=classify_error(e),
                            error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0,
                            remote_bytes=remote.bytes_read - before if remote is not None else 0)
