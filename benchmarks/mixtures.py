"""Several sources and mixtures (issue 24): sealing at 100k shards, and in-process reads, 1 source against 3.

    python -m benchmarks.mixtures [--shards 100000] [--seals 30] [--samples 150000] [--passes 3] [--epochs 5]
                                  [--parts seal,read] [--json out.json] [--quick] [--workdir DIR]

Part 1, sealing (in-process, no daemon, nothing but the shard table): an LMDB environment opened with
``samplecache_service.store.writer.open_env`` holds ``--shards`` shard records (100 rows each, no blocks), written
through the daemon's ``Writer`` into its ``Catalog``; an ``EpochManager`` over them seals epoch after epoch
(``manifest(e)`` of the next epoch: always a new seal, never the reuse path), with the source shares and manifest
fields a daemon gives it. Between two seals the cache turns over one shard (the oldest of the first source goes, a
new one comes), as a cache that samples does. Timed: ``manifest(e)`` from the call to the sealed bytes (reading the
previous epoch's shard ids, then on the writer thread: choosing the shards, the manifest, its commit with every
named shard's ``last_used_epoch``). The first seal (no previous epoch) is not counted. ``make``: choosing the
shards (``resident_for_epoch``) and making the manifest's bytes (``build_manifest``, JSON) alone, timed after each
seal. Variants: 1 source (the bare ``default``, as a one-source daemon) and 3 sources, web/code/math at 70/20/10%
of the shards, shares to match. Every manifest is verified: its shards, samples and each source's shards.

Part 2, in-process reads (``samplecache.arrays.NumpyBatches``, batch 256, shuffled, no workers): four generated
Parquet datasets of ``x`` = 256 random float32 (1 KiB) + int64 ``y`` (``benchmarks.harness.data``): ``one`` with
``--samples`` rows, cached by a one-source daemon (``harness.build_cache``), and ``web``/``code``/``math`` with
70/20/10% as many, cached by one daemon with the three named sources (``--source web=URL --source code=URL ...``,
``--share`` to match). Rows:

* ``one      none``        the 1-source cache, no mixture (the baseline);
* ``three    none``        the 3-source cache, no mixture (every source as one source reads);
* ``three    random``      ``mixture={"web": 0.7, "code": 0.2, "math": 0.1}, mix="random"``;
* ``three    stratified``  the same mixture, ``mix="stratified"`` (each global batch holds each share).

Both daemons run (idle) while the rows take turns: a warm-up pass of each, then ``--passes`` rounds of one timed
pass of each (a change in the machine's load falls on every row alike); the median. A pass reads ``--epochs``
epochs (the job's next ones; each epoch's set-up, lease and manifest included): one epoch of 150 MB is ~0.1 s here,
too short to time alone. The mixture's weights are the sources' sizes, so its epoch reads every sample exactly once:
every pass, warm-up included, is verified against the Parquet truth (count, sum of ``y``, checksum of ``x``).
``x one`` = samples/s over the baseline's. Goals (issue 24): the 3-source mixture read >= 0.9x the 1-source read;
sealing p99 <= 50 ms at 100k shards.

Parquet files and caches live under ``--workdir`` (default ./bench-data) and are reused while their parameters
match; the sealing environments are removed after each variant. MB = 10**6 B of ``x``. Exit code 1 when a pass or a
manifest failed verification.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from samplecache.format.manifest import Manifest
from samplecache_service.epochs.jobs import JobTable
from samplecache_service.epochs.leases import LeaseTable
from samplecache_service.epochs.manager import EpochManager, EpochRules, build_manifest
from samplecache_service.remote.columns import infer_schema
from samplecache_service.store.budget import Budget
from samplecache_service.store.catalog import Catalog, Shard, u64
from samplecache_service.store.lmdbmap import open_env
from samplecache_service.store.writer import Writer
from samplecache_tools.launch import DaemonProcess

from .harness import (
    Check,
    Row,
    Spec,
    Tally,
    build_cache,
    cli,
    fail,
    fmt,
    generate,
    http_json,
    read_json,
    report,
    serve,
    start_daemon,
    stop_daemon,
    text_table,
    wait_samples,
    write_json,
)
from .harness.cli import log

MIX = {"web": 0.7, "code": 0.2, "math": 0.1}
SHARD_ROWS = 100  # rows per shard record of the sealing part
SEAL_GOAL_MS = 50.0
READ_GOAL = 0.9
BATCH = 256
WIDTH = 256  # float32 items of x: 1 KiB a sample


# --- part 1: sealing ---------------------------------------------------------------------------------------------

def split(total: int, names: list[str]) -> dict[str, int]:
    """``total`` over ``names`` in MIX's proportions (one name: all of it); the last takes the rounding."""
    if len(names) == 1:
        return {names[0]: total}
    out = {n: int(total * MIX[n]) for n in names[:-1]}
    return {**out, names[-1]: total - sum(out.values())}


class SealParts:
    """The daemon's parts that seal, in-process over ``root/lmdb``: a shard table of ``counts`` shards per source
    (100 rows, 100 KiB each), a budget they fit in, the sources' shares in proportion to them."""

    def __init__(self, root: Path, counts: dict[str, int], keep_last: int = 4) -> None:
        self.counts = counts
        total = sum(counts.values())
        self.env, self.dbs = open_env(root / "lmdb", 1 << 31)
        self.catalog = Catalog(self.env, self.dbs)
        self.writer = Writer(self.env, self.dbs, self.catalog)
        self.next_id = 1
        # the sources' shards interleaved in id (= age) order, as sources sampled side by side leave them
        names = list(counts)
        order = np.random.default_rng(0).permutation(np.repeat(np.arange(len(names)), list(counts.values())))
        self._add([self._shard(names[i]) for i in order.tolist()])
        schema, skipped = infer_schema(pa.schema([("x", pa.list_(pa.float32(), WIDTH)), ("y", pa.int64())]))
        named = {n: {"schema": schema.to_json(), "url": f"file:///data/{n}/", "skipped_columns": skipped}
                 for n in counts}
        self.fields = {"schema": schema.to_json(), "lmdb_path": str(root / "lmdb"), "skipped_columns": skipped,
                       "map_size": 1 << 31, "seed": 0, "source": f"file:///data/{next(iter(counts))}/",
                       "cache_id": "bench", "sources": named, "remote_bytes": 0}
        shares = {n: c / total for n, c in counts.items()}
        # a budget that every source's shards fit in with the headroom kept: a seal names them all
        budget = Budget(4 * total * SHARD_ROWS * 1024, 0, "fifo")
        self.epochs = EpochManager(self.catalog, self.writer, LeaseTable(default_ttl=60.0), JobTable(60.0), budget,
                                   lambda: dict(self.fields), EpochRules(keep_last=keep_last),
                                   shares=lambda: shares)

    def _shard(self, source: str) -> Shard:
        sid, self.next_id = self.next_id, self.next_id + 1
        return Shard(id=sid, key=f"{source}-u{sid}", path=f"{source}/part-{sid // 100:05d}.parquet",
                     row_group=sid % 100, unit=sid, cycle=0, rows=SHARD_ROWS, bytes=SHARD_ROWS * 1024,
                     rows_per_block=SHARD_ROWS, blocks=1, created=time.time(), source=source)

    def _add(self, shards: list[Shard], drop: tuple[int, ...] = ()) -> None:
        """One write transaction: ``shards`` in, ``drop`` out (the catalog's mirror updated after the commit)."""
        def op(txn: Any) -> None:
            for sid in drop:
                txn.delete(u64(sid), db=self.dbs[b"shards"])
            for s in shards:
                txn.put(u64(s.id), s.to_json(), db=self.dbs[b"shards"], append=True)

        def after(_: Any) -> None:
            for sid in drop:
                self.catalog.removed_shard(sid)
            for s in shards:
                self.catalog.added_shard(s)
        self.writer.submit(op, after).result()

    def turn_over(self) -> None:
        """The oldest shard of the first source goes, a new one of it comes."""
        first = next(iter(self.counts))
        oldest = next(s.id for s in self.catalog.shards() if s.source == first)
        self._add([self._shard(first)], drop=(oldest,))

    def check(self, raw: bytes) -> str | None:
        """What is wrong with a sealed manifest (None: every shard, sample and source as built)."""
        m = Manifest.from_json(json.loads(raw))
        total = sum(self.counts.values())
        names = sorted(self.counts)
        per = dict(zip(m.source_names(), np.bincount(m.source_of(), minlength=len(m.source_names())).tolist()))
        if len(m.table()) != total or m.samples != total * SHARD_ROWS or m.source_names() != names \
                or per != self.counts:
            return f"epoch {m.epoch}: {len(m.table())} shards, {m.samples} samples, per source {per}"
        return None

    def make_ms(self, epoch: int) -> float:
        """Milliseconds to choose ``epoch``'s shards and make its manifest's bytes as its seal did, alone: without
        reading the previous epoch's manifest and without the commit."""
        previous = np.array(sorted(self.epochs.shard_ids(epoch - 1)), np.int64)
        t = time.perf_counter()
        json.dumps(build_manifest(epoch, self.epochs.resident_for_epoch(), previous=previous,
                                  **self.fields).to_json(packed=True), separators=(",", ":"))
        return (time.perf_counter() - t) * 1e3

    def close(self) -> None:
        self.writer.close()
        self.env.close()


def seal_run(root: Path, counts: dict[str, int], seals: int) -> dict[str, Any]:
    """``seals`` timed seals (after one untimed), one shard turned over before each; ms and checks."""
    if root.exists():
        shutil.rmtree(root)
    t0 = time.perf_counter()
    parts = SealParts(root, counts)
    build_s = time.perf_counter() - t0
    times: list[float] = []
    made: list[float] = []
    sizes: list[int] = []
    problems: list[str] = []

    async def run() -> None:
        for e in range(seals + 1):
            if e:
                parts.turn_over()
            t = time.perf_counter()
            raw = await parts.epochs.manifest(e)
            dt = (time.perf_counter() - t) * 1e3
            if e:
                times.append(dt)
                sizes.append(len(raw))
                made.append(parts.make_ms(e))
            if (why := parts.check(raw)) is not None:
                problems.append(why)
    try:
        asyncio.run(run())
    finally:
        parts.close()
        shutil.rmtree(root, ignore_errors=True)
    out = {"sources": counts, "shards": sum(counts.values()), "seals": seals, "build_s": build_s,
           "times_ms": times, "p50_ms": statistics.median(times), "p99_ms": float(np.percentile(times, 99)),
           "max_ms": max(times), "make_ms": made, "make_p50_ms": statistics.median(made),
           "make_p99_ms": float(np.percentile(made, 99)), "manifest_bytes": statistics.median(sizes),
           "problems": problems}
    log(f"seal {len(counts)} source(s), {out['shards']:,} shards: p50 {out['p50_ms']:.1f} ms, "
        f"p99 {out['p99_ms']:.1f} ms, max {out['max_ms']:.1f} ms; made alone p50 {out['make_p50_ms']:.1f} ms")
    return out


# --- part 2: in-process reads ------------------------------------------------------------------------------------

def specs(samples: int, quick: bool) -> dict[str, Spec]:
    """``one`` (every sample) and ``web``/``code``/``math`` (70/20/10% of them)."""
    rg = 500 if quick else 10_000
    sizes = {"one": samples, **split(samples, list(MIX))}
    return {n: Spec(n, k, rg, "float32", WIDTH, BATCH, seed=11 + i, rows_per_file=rg * 4)
            for i, (n, k) in enumerate(sizes.items())}


def serve_three(parts: dict[str, Spec], root: Path) -> DaemonProcess:
    """The daemon with the three named sources over ``root/three/cache`` (dropped when the data changed), every
    sample cached, each source holding its own."""
    home = root / "three"
    params = {n: s.params() for n, s in parts.items()}
    if read_json(home / "params.json") != params and home.exists():
        shutil.rmtree(home)
    write_json(home / "params.json", params)
    urls = {n: f"file://{(root / n / 'parquet').resolve()}" for n in parts}
    first, *rest = urls
    extra = [a for n in rest for a in ("--source", f"{n}={urls[n]}")]
    extra += [a for n in urls for a in ("--share", f"{n}={MIX[n]}")]
    total = sum(s.samples for s in parts.values())
    max_bytes = 4 * total * (WIDTH * 4 + 64) + (256 << 20)
    d = start_daemon(f"{first}={urls[first]}", home / "cache", samplers=2, max_bytes=max_bytes,
                     log_path=home / "daemon.log", extra=extra)
    try:
        wait_samples(d, total, log, name="three", budget=120.0 + total * WIDTH * 4 / 10e6)
        held = {s["name"]: s["samples"] for s in http_json(d.url + "/v1/sources")}
        if held != {n: s.samples for n, s in parts.items()}:
            raise RuntimeError(f"the sources hold {held}, expected {({n: s.samples for n, s in parts.items()})}")
    except BaseException:
        d.stop()
        raise
    return d


def numpy_pass(batches: Any, check: Check, epochs: int) -> Callable[[], Tally]:
    """One pass: the job's next ``epochs`` epochs, every batch counted and checked."""
    def one() -> Tally:
        n = ysum = xsum = 0
        for _ in range(epochs):
            for b in batches:
                n += len(b["y"])
                ysum += int(b["y"].sum())
                xsum += check.block(b["x"])
        return Tally(n, ysum, xsum)
    return one


def take_turns(rows: list[tuple[Row, Callable[[], Tally]]], passes: int) -> None:
    """A warm-up pass of every row, then ``passes`` rounds of one timed pass of each, the rows taking turns (a
    change in the machine's load falls on every row alike); every pass verified against ``row.expected``."""
    for i in range(passes + 1):
        for row, one in rows:
            if row.error is not None:
                continue
            try:
                t0 = time.perf_counter()
                t = one()
                dt = time.perf_counter() - t0
            except Exception as e:  # reported in the table and the JSON; the other rows still run
                fail(row, e, log)
                continue
            got = {"samples": t.samples, "y_sum": t.y_sum, "x_check": t.x_check}
            ok = got == row.expected
            row.passes.append({"warmup": i == 0, "seconds": dt, "ok": ok, **({} if ok else {"got": got})})
            if i:
                row.times_s.append(dt)
            log(f"  {row.dataset:<5} {row.loader:<16} pass {i}: {dt:.3f} s{'' if ok else ' VERIFY FAILED'}")


def read_run(workdir: Path, samples: int, passes: int, epochs: int, quick: bool) -> list[Row]:
    """Both daemons up (idle), a NumpyBatches per row, the rows measured in turns."""
    from samplecache.arrays import NumpyBatches

    parts = specs(samples, quick)
    truths = {n: generate(s, (workdir / n).resolve(), log) for n, s in parts.items()}
    three = {n: s for n, s in parts.items() if n != "one"}
    truths["three"] = {k: sum(truths[n][k] for n in three) for k in ("samples", "y_sum", "x_check")}
    check = Check(parts["one"])
    one_root = (workdir / "one").resolve()
    manifest = build_cache(parts["one"], one_root, log)
    with ExitStack() as stack:
        urls = {"one": stack.enter_context(running(serve(parts["one"], one_root, manifest))).url,
                "three": stack.enter_context(running(serve_three(three, workdir.resolve()))).url}
        rows: list[tuple[Row, Callable[[], Tally]]] = []
        for dataset, mix in (("one", "none"), ("three", "none"), ("three", "random"), ("three", "stratified")):
            options: dict[str, Any] = {} if mix == "none" else {"mixture": MIX, "mix": mix}
            nb = stack.enter_context(NumpyBatches(urls[dataset], BATCH, columns=["x", "y"], shuffle=True, **options))
            expected = {k: v * epochs for k, v in truths[dataset].items()}
            rows.append((Row(f"numpy {mix}", dataset, 0, BATCH, WIDTH * 4, expected), numpy_pass(nb, check, epochs)))
        take_turns(rows, passes)
    return [r for r, _ in rows]


@contextmanager
def running(d: DaemonProcess) -> Iterator[DaemonProcess]:
    """``d`` until the block ends, then stopped (raising with its log tail if it exited badly)."""
    try:
        yield d
    finally:
        stop_daemon(d)


def ratios(rows: list[Row]) -> dict[int, float | None]:
    """Row index -> samples/s over the 1-source row's."""
    base = next((r.samples_per_s for r in rows if r.dataset == "one"), None)
    return {i: (r.samples_per_s / base if r.samples_per_s and base else None) for i, r in enumerate(rows)}


# --- the report ----------------------------------------------------------------------------------------------------

def seal_table(seal: dict[str, dict[str, Any]]) -> str:
    head = [("sources (shards each)", -33), ("seals", 6), ("p50 ms", 8), ("p99 ms", 8), ("max ms", 8),
            ("make p50", 9), ("make p99", 9), ("manifest", 10), (" verified", -9)]
    lines = []
    for name, s in seal.items():
        each = "/".join(f"{k:,}" for k in s["sources"].values())
        lines.append([(f"{name} ({each})", -33), (str(s["seals"]), 6), (f"{s['p50_ms']:.1f}", 8),
                      (f"{s['p99_ms']:.1f}", 8), (f"{s['max_ms']:.1f}", 8), (f"{s['make_p50_ms']:.1f}", 9),
                      (f"{s['make_p99_ms']:.1f}", 9), (cli.human(s["manifest_bytes"]), 10),
                      (" " + ("NO" if s["problems"] else "yes"), -9)])
    return text_table(head, lines)


def read_table(rows: list[Row]) -> str:
    x = ratios(rows)
    head = [("cache", -6), ("mixture", -11), ("samples/s", 12), ("MB/s", 9), ("x one", 6), (" verified", -9)]
    return text_table(head, [[(r.dataset, -6), (r.loader.split()[1], -11), (fmt(r.samples_per_s, ",.0f"), 12),
                              (fmt(r.mb_per_s, ",.1f"), 9), (fmt(x[i], ".3f"), 6), (" " + r.status, -9)]
                             for i, r in enumerate(rows)])


def goals(seal: dict[str, dict[str, Any]], rows: list[Row], shards: int) -> list[dict[str, Any]]:
    out = []
    if "3 sources" in seal:
        p99 = seal["3 sources"]["p99_ms"]
        out.append({"goal": f"seal p99 at {shards:,} shards, 3 sources <= {SEAL_GOAL_MS:g} ms", "value": p99,
                    "met": p99 <= SEAL_GOAL_MS})
    x = ratios(rows)
    for i, r in enumerate(rows):
        if r.dataset == "three" and r.loader != "numpy none" and x[i] is not None:
            out.append({"goal": f"{r.loader.split()[1]} mixture read >= {READ_GOAL:g}x the 1-source read",
                        "value": x[i], "met": x[i] >= READ_GOAL})
    return out


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    cli.common(p, quick="2,000 shards, 3 seals, 6,000 samples, one pass (CI smoke run)")
    p.add_argument("--shards", type=int, default=None, help="shards of the sealing part (default 100000)")
    p.add_argument("--seals", type=int, default=None, help="timed seals per variant (default 30; --quick: 3)")
    p.add_argument("--samples", type=int, default=None,
                   help="samples of each read cache, a multiple of 10 (default 150000: 150 MB; --quick: 6000)")
    p.add_argument("--passes", type=int, default=None, help="timed passes per read row (default 3; --quick: 1)")
    p.add_argument("--epochs", type=int, default=None, help="epochs read per pass (default 5; --quick: 1)")
    p.add_argument("--parts", default="seal,read", help="comma-separated subset of seal,read")
    a = p.parse_args(argv)
    shards = a.shards or (2_000 if a.quick else 100_000)
    seals = a.seals or (3 if a.quick else 30)
    samples = a.samples or (6_000 if a.quick else 150_000)
    passes = a.passes or (1 if a.quick else 3)
    epochs = a.epochs or (1 if a.quick else 5)
    todo = cli.subset(p, "--parts", a.parts, ["seal", "read"])
    if samples % 10 or samples < 10 or shards < 10 or min(seals, passes, epochs) < 1:
        p.error("--samples: a multiple of 10; --shards >= 10; --seals, --passes and --epochs >= 1")
    t0, load_start = time.perf_counter(), report.loadavg()
    work = a.workdir / f"mixtures-{samples}"
    work.mkdir(parents=True, exist_ok=True)

    seal: dict[str, dict[str, Any]] = {}
    if "seal" in todo:
        for label, names in (("1 source", ["default"]), ("3 sources", list(MIX))):
            seal[label] = seal_run(work / "seal", split(shards, names), seals)
    rows = read_run(work, samples, passes, epochs, a.quick) if "read" in todo else []

    met = goals(seal, rows, shards)
    print()
    if seal:
        print(f"sealing, in-process: {seals} seals per variant after one untimed, one shard turned over before "
              f"each; ms from EpochManager.manifest(e) to the sealed bytes; 'make': choosing the shards and making "
              f"the manifest's bytes alone (no previous manifest read, no commit)")
        print(seal_table(seal))
        print()
    if rows:
        print(f"in-process reads: NumpyBatches, batch {BATCH}, shuffled, no workers; {samples:,} samples x "
              f"{WIDTH * 4:,} B per cache; a pass reads {epochs} epoch(s); median of {passes} pass(es) after a "
              f"warm-up, the rows taking turns, every pass verified; 'x one' = samples/s over the 1-source row's; "
              f"mixture {MIX}")
        print(read_table(rows))
        print()
    for g in met:
        print(f"goal: {g['goal']}: {g['value']:.3f} -> {'met' if g['met'] else 'NOT met'}")
    print(report.load_note(load_start))
    result = {"benchmark": "mixtures", "quick": a.quick, "shards": shards, "seals": seals, "samples": samples,
              "passes": passes, "epochs_per_pass": epochs, "mixture": MIX, "seal": seal, "goals": met,
              "read": report.rows_json(rows, ratios(rows), "ratio_to_one_source"),
              "seconds": time.perf_counter() - t0, "host": report.host(load_start)}
    code = report.finish(a.json, result, rows)
    return 1 if code or any(s["problems"] for s in seal.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
