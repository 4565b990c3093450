"""``samplecache verify``: a scrub of a cache, block by block, beside a live daemon or without one.

It checks the LMDB data file first (meta pages, length: ``cachedir.check_lmdb_file``, so a truncated file is
reported, never mapped), then opens it read-only (LMDB lets readers run beside the writer) and, in one read
transaction, walks the keys: every shard's blocks 0..n-1 are there, no record lies outside a shard. Then
each shard's blocks are checked in a read transaction of their own (kept short, so the daemon can reuse
freed pages): their checksum (``samplecache.format.record.verify_block``), or with ``--quick`` only their header.
A shard the daemon evicts during the scrub is counted, not reported.

Exit codes: 0 clean, 1 damage found (a block, a missing block, the file itself), 2 nothing could be checked
(no cache there, not a samplecache cache, another record format).
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

import lmdb

from samplecache.format.constants import MAX_READERS
from samplecache.format.record import FORMAT_VERSION, parse_key, shard_prefix, verify_block
from samplecache_service.store.cachedir import StartupError, check_lmdb_file
from samplecache_service.store.catalog import u64
from samplecache_service.store.lmdbmeta import read_meta

SHOWN = 100  # damaged blocks listed in the text output (--json lists all)

FILE_CHECKS = 3  # reads of the file's header before it is called damaged (a live writer may be mid-commit)


class CannotVerify(Exception):
    """Nothing could be checked: the message says why (exit 2)."""


@dataclass
class Damage:
    shard: int
    block: int
    reason: str


@dataclass
class ScrubReport:
    cache: str
    quick: bool
    shards_total: int = 0
    bytes_total: int = 0
    shards: int = 0          # shards checked
    blocks: int = 0          # blocks checked
    bytes: int = 0           # bytes checked (hashed, unless quick)
    evicted: int = 0         # shards the daemon evicted while the scrub ran
    seconds: float = 0.0
    file_error: str | None = None
    damaged: list[Damage] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.file_error is None and not self.damaged

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["clean"] = self.clean
        out["damaged_shards"] = sorted({d.shard for d in self.damaged})
        return out


def _open(lmdb_dir: Path) -> tuple[lmdb.Environment, Any, Any]:
    data = lmdb_dir / "data.mdb"
    if not data.is_file():
        raise CannotVerify(f"no samplecache cache at {lmdb_dir} (no data.mdb): pass --cache-dir")
    try:
        env = lmdb.open(str(lmdb_dir), readonly=True, lock=True, max_readers=MAX_READERS, max_dbs=8, subdir=True,
                        map_size=read_meta(data).map_size, readahead=False)
    except lmdb.Error as e:
        raise CannotVerify(f"cannot open {data} read-only: {e}") from None
    try:
        records, shards, meta = (env.open_db(n, create=False) for n in (b"records", b"shards", b"meta"))
        with env.begin() as txn:
            fmt = txn.get(b"format", db=meta)
    except lmdb.Error as e:
        env.close()
        raise CannotVerify(f"{data} is not a samplecache cache: {e}") from None
    if fmt is not None and json.loads(fmt) != FORMAT_VERSION:
        env.close()
        raise CannotVerify(f"{data} holds record format v{json.loads(fmt)}; this samplecache reads "
                           f"v{FORMAT_VERSION}: restart the daemon with --reset-cache to rebuild it")
    return env, records, shards


def _begin(env: lmdb.Environment) -> lmdb.Transaction:
    try:
        return env.begin(buffers=True)
    except lmdb.MapResizedError:  # the live daemon grew the file
        env.set_mapsize(0)
        return env.begin(buffers=True)


def _walk_keys(env: lmdb.Environment, records: Any, shards: Any, report: ScrubReport) -> dict[int, int]:
    """{shard: blocks} of the catalog, and the key-level damage, from one consistent snapshot."""
    expected: dict[int, int] = {}
    seen: dict[int, set[int]] = defaultdict(set)
    with _begin(env) as txn:
        for key, raw in txn.cursor(db=shards):
            s = json.loads(bytes(raw))
            expected[int.from_bytes(bytes(key), "big")] = int(s["blocks"])
            report.bytes_total += int(s["bytes"])
        for key in txn.cursor(db=records).iternext(keys=True, values=False):
            sid, b = parse_key(bytes(key))
            if sid not in expected:
                report.damaged.append(Damage(sid, b, "a record of no catalogued shard"))
            elif b >= expected[sid]:
                report.damaged.append(Damage(sid, b, f"beyond the shard's {expected[sid]} blocks"))
            else:
                seen[sid].add(b)
    for sid, n in expected.items():
        report.damaged += [Damage(sid, b, "missing") for b in range(n) if b not in seen[sid]]
    report.shards_total = len(expected)
    return expected


def scrub(lmdb_dir: Path, quick: bool = False, progress: Callable[[ScrubReport], None] | None = None
          ) -> ScrubReport:
    """Check every block of every shard of the cache at ``lmdb_dir``; CannotVerify when there is none."""
    t0 = time.monotonic()
    report = ScrubReport(cache=str(lmdb_dir / "data.mdb"), quick=quick)
    for attempt in range(FILE_CHECKS):
        try:
            check_lmdb_file(lmdb_dir)
            break
        except StartupError as e:  # beside a live writer the header may be read mid-commit: look again first
            if attempt == FILE_CHECKS - 1:
                report.file_error = str(e)
                return report
            time.sleep(0.2)
    env, records, shards = _open(lmdb_dir)
    try:
        expected = _walk_keys(env, records, shards, report)
        for sid in sorted(expected):
            with _begin(env) as txn:  # one shard per read transaction
                if txn.get(u64(sid), db=shards) is None:
                    report.evicted += 1
                    continue
                prefix = shard_prefix(sid)
                cur = txn.cursor(db=records)
                if cur.set_range(prefix):
                    for key, buf in cur:
                        if bytes(key[:8]) != prefix:
                            break
                        reason = verify_block(buf, full=not quick)
                        if reason is not None:
                            report.damaged.append(Damage(sid, parse_key(bytes(key))[1], reason))
                        report.blocks += 1
                        report.bytes += len(buf)
            report.shards += 1
            report.seconds = time.monotonic() - t0
            if progress is not None:
                progress(report)
    except lmdb.Error as e:  # LMDB found its own pages damaged
        report.file_error = f"{report.cache}: {type(e).__name__}: {e}"
    finally:
        env.close()
    report.seconds = time.monotonic() - t0
    return report


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class Progress:
    """A plain-text progress line on ``out``: rewritten about once a second on a terminal; the final line
    always."""

    def __init__(self, out: TextIO, interval: float = 1.0) -> None:
        self.out, self.interval = out, interval
        self.tty = out.isatty()
        self._last = 0.0

    def line(self, r: ScrubReport) -> str:
        frac = r.bytes / r.bytes_total if r.bytes_total and not r.quick else r.shards / max(1, r.shards_total)
        bar = "#" * int(30 * min(1.0, frac))
        rate = r.bytes / r.seconds / 1e6 if r.seconds else 0.0
        eta = r.seconds * (1 - frac) / frac if 0 < frac < 1 else 0.0
        return (f"[{bar:<30}] {100 * frac:5.1f}% {r.shards}/{r.shards_total} shards {r.blocks} blocks "
                f"{_gib(r.bytes)} {rate:,.0f} MB/s {len(r.damaged)} damaged"
                + (f" eta {eta:.0f}s" if eta else ""))

    def __call__(self, r: ScrubReport) -> None:
        if self.tty and time.monotonic() - self._last >= self.interval:
            self._last = time.monotonic()
            self.out.write("\r" + self.line(r))
            self.out.flush()

    def final(self, r: ScrubReport) -> None:
        self.out.write(("\r" if self.tty else "") + self.line(r) + f" in {r.seconds:.1f}s\n")
        self.out.flush()


def summary(r: ScrubReport) -> str:
    """The text report: the damage (at most SHOWN lines) and one closing line."""
    lines = [f"damaged: shard {d.shard} block {d.block}: {d.reason}" for d in r.damaged[:SHOWN]]
    if len(r.damaged) > SHOWN:
        lines.append(f"... and {len(r.damaged) - SHOWN} more (--json lists all)")
    what = "headers of " if r.quick else ""
    if r.file_error:
        lines.append(f"DAMAGED: {r.file_error}")
    elif r.damaged:
        ids = sorted({d.shard for d in r.damaged})
        lines.append(f"DAMAGED: {len(r.damaged)} block(s) in {len(ids)} shard(s) ({', '.join(map(str, ids[:20]))}"
                     f"{', ...' if len(ids) > 20 else ''}) of {r.cache}: restart the daemon with --reset-cache to "
                     f"rebuild the cache")
    else:
        lines.append(f"clean: {what}{r.blocks} blocks of {r.shards} shards ({_gib(r.bytes)}) in {r.cache} checked "
                     f"in {r.seconds:.1f}s" + (f"; {r.evicted} shard(s) evicted meanwhile" if r.evicted else ""))
    return "\n".join(lines)


def run_verify(lmdb_dir: Path, quick: bool = False, as_json: bool = False, err: TextIO = sys.stderr,
               out: TextIO = sys.stdout) -> int:
    """The command: progress on ``err``, the report on ``out``; the exit code."""
    bar = Progress(err)
    try:
        report = scrub(lmdb_dir, quick, bar)
    except CannotVerify as e:
        print(f"samplecache verify: {e}", file=err)
        return 2
    bar.final(report)
    print(json.dumps(report.to_json(), indent=2) if as_json else summary(report), file=out)
    return 0 if report.clean else 1
