"""A consistency checker for a samplecache LMDB cache, opened read-only from outside the daemon.

``check_cache(path)`` reads the whole environment in ONE read transaction (a consistent snapshot, safe while the
daemon runs or after it was killed) and verifies invariant 3 of DESIGN.md from the bytes on disk:

* every catalogued shard has exactly ``blocks`` records, keyed ``record_key(id, 0 .. blocks-1)``;
* every record decodes with ``samplecache.format.record`` under the schema stored in ``meta``; each block but the last
  holds ``rows_per_block`` rows, the rows add up to the shard's ``rows`` and the record sizes to its ``bytes``;
* no orphan record (a record key whose shard id is not catalogued) and no malformed key;
* no two shards with the same staging key (a staging file ingested twice);
* ``meta`` ``next_shard`` is above every shard id;
* every sealed epoch manifest parses, names its own epoch, and its totals add up; where a shard it names is still
  resident, the manifest's entry agrees with the catalog.

Problems are collected and raised together as one AssertionError; otherwise a ``CacheSummary`` comes back.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import lmdb
import numpy as np

from samplecache.format.manifest import Manifest
from samplecache.format.record import BlockView, FormatError, Schema, decode_rows, parse_key, record_key

DB_NAMES = (b"records", b"shards", b"epochs", b"files", b"meta")
SHARD_FIELDS = ("id", "key", "path", "row_group", "unit", "cycle", "rows", "bytes", "rows_per_block", "blocks",
                "created")


@dataclass
class CacheSummary:
    shard_ids: list[int]
    shards: dict[int, dict[str, Any]]          # id -> shard JSON (as stored)
    shard_raw: dict[int, bytes]                # id -> shard JSON bytes (as stored)
    manifests: dict[int, bytes]                # epoch -> sealed manifest bytes (as stored)
    meta: dict[str, Any]
    files: dict[str, dict[str, Any]]
    next_shard: int | None
    records: int                               # record (block) count
    rows: int                                  # resident samples
    bytes: int                                 # resident sample bytes
    keys: dict[str, int] = field(default_factory=dict)  # staging key -> shard id

    def manifest(self, epoch: int) -> dict[str, Any]:
        return json.loads(self.manifests[epoch])

    def manifest_ids(self, epoch: int) -> list[int]:
        return Manifest.from_json(self.manifest(epoch)).table()[:, 0].tolist()


def lmdb_dir(path: str | Path) -> Path:
    """The LMDB environment directory: ``path`` itself or ``path/lmdb`` (a cache dir)."""
    p = Path(path)
    return p if (p / "data.mdb").exists() else p / "lmdb"


def open_readonly(path: str | Path) -> lmdb.Environment:
    return lmdb.open(str(lmdb_dir(path)), readonly=True, lock=True, max_dbs=8, subdir=True, readahead=False)


def check_cache(path: str | Path, *, decode: bool = True,
                expect_ids: Callable[[dict[str, Any]], np.ndarray] | None = None,
                id_column: str = "id") -> CacheSummary:
    """Verify the cache at ``path`` (a cache dir or its ``lmdb`` dir); return a summary or raise AssertionError.

    ``decode`` decodes every row of every record (not only the block headers). ``expect_ids(shard_json)`` gives
    the ``id_column`` values a shard must hold, in order (ground truth of the unit it sampled)."""
    problems: list[str] = []
    env = open_readonly(path)
    try:
        dbs = {name: env.open_db(name, create=False) for name in DB_NAMES}
        with env.begin(buffers=False) as txn:
            summary = _check(txn, dbs, problems, decode, expect_ids, id_column)
    finally:
        env.close()
    if problems:
        shown = "\n  ".join(problems[:40])
        more = f"\n  ... and {len(problems) - 40} more" if len(problems) > 40 else ""
        raise AssertionError(f"cache {lmdb_dir(path)} is inconsistent ({len(problems)} problems):\n  {shown}{more}")
    return summary


def _check(txn: lmdb.Transaction, dbs: dict[bytes, Any], problems: list[str], decode: bool,
           expect_ids: Callable[[dict[str, Any]], np.ndarray] | None, id_column: str) -> CacheSummary:
    # -- meta and schema
    meta: dict[str, Any] = {}
    for k, v in txn.cursor(db=dbs[b"meta"]):
        try:
            meta[k.decode()] = json.loads(v)
        except ValueError as e:
            problems.append(f"meta {k!r} is not JSON: {e}")
    schema: Schema | None = None
    if "schema" in meta:
        try:
            schema = Schema.from_json(meta["schema"])
        except (FormatError, KeyError, TypeError) as e:
            problems.append(f"meta schema does not parse: {e}")

    files: dict[str, dict[str, Any]] = {}
    for k, v in txn.cursor(db=dbs[b"files"]):
        try:
            files[k.decode()] = json.loads(v)
        except ValueError as e:
            problems.append(f"files {k!r} is not JSON: {e}")

    # -- shards
    shards: dict[int, dict[str, Any]] = {}
    shard_raw: dict[int, bytes] = {}
    keys: dict[str, int] = {}
    for k, v in txn.cursor(db=dbs[b"shards"]):
        if len(k) != 8:
            problems.append(f"shards: malformed key {k!r}")
            continue
        sid = int.from_bytes(k, "big")
        try:
            s = json.loads(v)
        except ValueError as e:
            problems.append(f"shard {sid}: JSON does not parse: {e}")
            continue
        missing = [f for f in SHARD_FIELDS if f not in s]
        if missing:
            problems.append(f"shard {sid}: fields {missing} missing")
            continue
        if s["id"] != sid:
            problems.append(f"shard stored under id {sid} says id {s['id']}")
        if s["key"] in keys:
            problems.append(f"staging key {s['key']!r} ingested twice: shards {keys[s['key']]} and {sid}")
        keys[s["key"]] = sid
        shards[sid] = s
        shard_raw[sid] = bytes(v)

    # -- records, grouped by shard
    by_shard: dict[int, dict[int, bytes]] = defaultdict(dict)
    n_records = 0
    for k, v in txn.cursor(db=dbs[b"records"]):
        n_records += 1
        if len(k) != 12:
            problems.append(f"records: malformed key {k.hex()}")
            continue
        sid, block = parse_key(k)
        if record_key(sid, block) != k:
            problems.append(f"records: key {k.hex()} does not round-trip")
        by_shard[sid][block] = v
    orphans = sorted(set(by_shard) - set(shards))
    if orphans:
        problems.append(f"orphan records of shards not in the catalog: {orphans[:20]} "
                        f"({sum(len(by_shard[o]) for o in orphans)} records)")

    total_rows = total_bytes = 0
    for sid, s in shards.items():
        blocks = by_shard.get(sid, {})
        want = set(range(int(s["blocks"])))
        if set(blocks) != want:
            problems.append(f"shard {sid} ({s['key']}): blocks {sorted(blocks)} != 0..{int(s['blocks']) - 1} "
                            f"(half shard)")
            continue
        size = sum(len(b) for b in blocks.values())
        if size != s["bytes"]:
            problems.append(f"shard {sid}: records hold {size} bytes, catalog says {s['bytes']}")
        if schema is None:
            problems.append(f"shard {sid} is catalogued but meta has no schema")
            continue
        rows = 0
        ids: list[np.ndarray] = []
        for b in range(int(s["blocks"])):
            try:
                view = BlockView(blocks[b], schema)
                n = view.nrows
                if decode:
                    decode_rows(blocks[b], schema)
                if expect_ids is not None:
                    ids.append(np.asarray(view.column_array(schema.index(id_column))).copy())
            except (FormatError, ValueError, IndexError, KeyError, UnicodeDecodeError) as e:
                problems.append(f"shard {sid} block {b}: does not decode: {type(e).__name__}: {e}")
                break
            last = b == int(s["blocks"]) - 1
            if (not last and n != s["rows_per_block"]) or (last and not 0 < n <= s["rows_per_block"]):
                problems.append(f"shard {sid} block {b}: {n} rows, rows_per_block is {s['rows_per_block']}")
            rows += n
        else:
            if rows != s["rows"]:
                problems.append(f"shard {sid}: blocks hold {rows} rows, catalog says {s['rows']}")
            if expect_ids is not None:
                got, exp = np.concatenate(ids) if ids else np.zeros(0, np.int64), np.asarray(expect_ids(s))
                if got.shape != exp.shape or not np.array_equal(got, exp):
                    problems.append(f"shard {sid} ({s['path']} row group {s['row_group']}): ids "
                                    f"{got[:5].tolist()}... != expected {exp[:5].tolist()}... (wrong rows)")
        total_rows += int(s["rows"])
        total_bytes += int(s["bytes"])

    next_shard = meta.get("next_shard")
    if shards:
        if next_shard is None:
            problems.append("meta next_shard is missing while shards exist")
        elif int(next_shard) <= max(shards):
            problems.append(f"meta next_shard {next_shard} is not above the newest shard id {max(shards)}")

    # -- sealed epochs
    manifests: dict[int, bytes] = {}
    for k, v in txn.cursor(db=dbs[b"epochs"]):
        epoch = int.from_bytes(k, "big")
        manifests[epoch] = bytes(v)
        try:
            m = json.loads(v)
            entries = Manifest.from_json(m).table().tolist()  # stored packed (shards_packed), or as a list
            if m["epoch"] != epoch:
                problems.append(f"manifest stored as epoch {epoch} says epoch {m['epoch']}")
            if sum(int(e[1]) for e in entries) != m["samples"]:
                problems.append(f"epoch {epoch}: shard rows do not add up to samples {m['samples']}")
            if sum(int(e[2]) for e in entries) != m["bytes"]:
                problems.append(f"epoch {epoch}: shard bytes do not add up to bytes {m['bytes']}")
            Schema.from_json(m["schema"])
            for e in entries:
                s = shards.get(int(e[0]))
                if s is not None and [s["id"], s["rows"], s["bytes"], s["rows_per_block"]] != list(e):
                    problems.append(f"epoch {epoch}: entry {e} disagrees with catalogued shard {s}")
        except (ValueError, KeyError, TypeError, IndexError, FormatError) as e:
            problems.append(f"epoch {epoch}: manifest does not parse: {type(e).__name__}: {e}")

    return CacheSummary(shard_ids=sorted(shards), shards=shards, shard_raw=shard_raw, manifests=manifests,
                        meta=meta, files=files, next_shard=None if next_shard is None else int(next_shard),
                        records=n_records, rows=total_rows, bytes=total_bytes, keys=keys)
