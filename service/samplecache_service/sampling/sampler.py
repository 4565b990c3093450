"""The sampling task: runs in a sampler subprocess, never in the daemon.

Reads one remote unit (a row group, a run of tiny ones, or a large one in slices), encodes it into
record blocks and writes one staging file per part of about ``part_bytes``. Every outcome comes back as a
``SampleResult`` value.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from samplecache.format.record import Schema
from samplecache_service.remote.partitions import add_partitions
from samplecache_service.remote.schemas import SchemaConflict, conform, from_text
from samplecache_service.remote.stores import ErrorKind, FsspecRemote, chunk_bytes, classify_error
from samplecache_service.sampling.encoder import encode_table_pieces
from samplecache_service.store.staging import block_length, write_staged

_REMOTES: dict[tuple[str, str], FsspecRemote] = {}
_SCHEMAS: dict[str, pa.Schema] = {}


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
    row_groups: int = 1            # consecutive row groups from ``row_group``
    part_bytes: int = 64 << 20     # target decoded bytes of one shard
    arrow_schema: str | None = None  # the dataset's unified Arrow schema (schemas.to_text)
    file_size: int = 0             # the file's size and its footer's length, from discovery (0: not known):
    footer_bytes: int = 0          # the footer is then read in one exact ranged read, with no HEAD request
    # the file's partition values (column -> text, None: null): constant columns of every row it gives
    partitions: dict[str, str | None] = field(default_factory=dict)
    name: str = "default"          # the named source: in the staging header, so a leftover file knows its source


@dataclass
class SampleResult:
    task: SampleTask
    ok: bool
    staged: str | None = None      # the last (or only) part
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    error_kind: str | None = None  # remote.classify_error's kinds, or 'changed' (the file replaced since it was listed)
    error: str | None = None
    remote_bytes: int = 0          # bytes fetched from the remote store for this task
    needed_bytes: int = 0          # bytes of the column chunks the unit needs (remote_bytes / this: read amplification)
    extra: dict[str, Any] = field(default_factory=dict)
    # the last shard of its unit: the unit is done once this one is in
    final: bool = True
    parts: list[tuple[str, int]] = field(default_factory=list)  # (staging file, bytes) of every shard, in order


def _remote(task: SampleTask) -> FsspecRemote:
    k = (task.source, repr(sorted(task.storage_options.items())))
    if k not in _REMOTES:
        _REMOTES[k] = FsspecRemote(task.source, task.storage_options)
    return _REMOTES[k]


def _target(text: str | None, names: list[str]) -> pa.Schema | None:
    if text is None:
        return None
    got = _SCHEMAS.get(text)
    if got is None:
        got = _SCHEMAS[text] = from_text(text)
    return pa.schema([got.field(n) for n in names], metadata=got.metadata)


def run_task(task: SampleTask) -> SampleResult:
    """Read, encode and stage one unit, as one shard per part of about ``part_bytes``. Never raises."""
    t0 = time.perf_counter()
    remote = None
    before = 0
    try:
        remote = _remote(task)
        before = remote.bytes_read
        schema = Schema.from_json(task.schema)
        target = _target(task.arrow_schema, schema.names)
        md = remote.footer(task.path, task.file_size, task.footer_bytes)
        first_row = sum(md.row_group(g).num_rows for g in range(task.row_group))
        parts: list[tuple[str, int]] = []
        rows = 0
        pending = None
        for table in remote.read_unit(task.path, task.row_group, task.row_groups, schema.names, task.part_bytes,
                                      task.file_size, task.footer_bytes):
            if pending is not None:
                parts.append(_stage(task, pending, schema, first_row + rows - pending.num_rows, len(parts), False))
            if task.partitions:
                table = add_partitions(table, task.partitions, target)
            if target is not None:
                try:
                    table = conform(table, target)
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
                    # read fine, but its values do not fit the dataset's unified type (uint64 beyond int64, ...)
                    raise SchemaConflict(f"values do not fit the dataset's schema: {e}") from e
            rows += table.num_rows
            pending = table
        if pending is not None:
            parts.append(_stage(task, pending, schema, first_row + rows - pending.num_rows, len(parts), True))
        return SampleResult(task=task, ok=True, staged=parts[-1][0] if parts else None, rows=rows,
                            bytes=sum(b for _, b in parts), seconds=time.perf_counter() - t0,
                            remote_bytes=remote.bytes_read - before, parts=parts,
                            needed_bytes=chunk_bytes(md, range(task.row_group, task.row_group + task.row_groups),
                                                     schema.names))
    except Exception as e:  # every failure is a value; the supervisor decides what to do
        for staged, _ in locals().get("parts", []):
            Path(staged).unlink(missing_ok=True)  # the unit is sampled again whole: no part of it stays staged
        kind, error = classify_error(e), f"{type(e).__name__}: {e}"
        if kind == ErrorKind.CORRUPT and remote is not None and task.file_size:
            now = remote.current_size(task.path)  # unparsable at the listed size: was the file replaced since?
            if now != task.file_size:
                kind, error = ErrorKind.CHANGED, (f"the file changed since it was listed ({task.file_size} bytes, now "
                                          f"{'gone' if now is None else now}): {error}")
        return SampleResult(task=task, ok=False, error_kind=kind, error=error, seconds=time.perf_counter() - t0,
                            remote_bytes=remote.bytes_read - before if remote is not None else 0)


def _stage(task: SampleTask, table: pa.Table, schema: Schema, first_row: int, part: int,
           final: bool) -> tuple[str, int]:
    """One part of the unit as a staging file (one shard): its provenance in the header."""
    blocks, rows_per_block = encode_table_pieces(table, schema, task.block_bytes)  # views of the table: no copy
    key = task.key if part == 0 and final else f"{task.key}-p{part}"
    header = {"key": key, "path": task.path, "row_group": task.row_group, "row_groups": task.row_groups,
              "first_row": first_row, "part": part, "final": final, "unit": task.unit, "cycle": task.cycle,
              "rows": table.num_rows, "rows_per_block": rows_per_block, "partitions": task.partitions,
              "source": task.name}
    staged = write_staged(Path(task.staging_dir), key, header, blocks)
    return str(staged), sum(block_length(b) for b in blocks)
