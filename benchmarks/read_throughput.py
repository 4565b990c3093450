#!/usr/bin/env python
"""Warm read throughput of samplecache against the raw LMDB limit.

    python benchmarks/read_throughput.py [--small N] [--large N] [--passes 3]
                                         [--json out.json] [--quick] [--workdir DIR]

Two datasets are generated as local Parquet (random, incompressible, written
uncompressed) and cached by the real daemon (``samplecache serve`` on a
``file://`` source, ``--samplers 2``):

* SMALL: N samples (default 400,000) of ``x`` = fixed_size_list<uint8, 256> + int64 ``y``;
* LARGE: N samples (default 3,000) of ``x`` = fixed_size_list<float32, 262144> (1 MiB) + int64 ``y``.

The Parquet files and the caches live under ``--workdir`` (default ./bench-data,
git-ignored) and are reused when their parameters match.

Every loader then reads epoch 0 of the cache with a warm page cache (one
untimed warm-up pass, then ``--passes`` timed passes, median reported). Every
pass, warm-up included, is verified: the sample count must equal the manifest's
and two checksums must equal the ground truth computed from the Parquet data
(sum of labels; a checksum over a fixed subset of every sample's ``x`` bytes:
bytes 0 and 255 for SMALL, every 4096th float32 (as int32 bits) for LARGE).

Loaders:

* ``lmdb-limit``    the LIMIT: one read-only LMDB cursor scan over the ``records`` db, shard
                    by shard of the manifest, each block decoded with ``BlockView`` and each
                    sample's ``x`` copied once (one ``.copy()`` per sample), per-sample checks.
                    Runs with the daemon stopped (the client opens LMDB read-only by itself).
* ``lmdb-block``    informational: the same scan copying a whole block's ``x`` at once
                    (no per-sample Python work): the ceiling for batch-oriented readers.
* ``client``        ``SampleCacheDataset(url, shuffle=True)`` iterated in-process, per sample.
* ``dataloader``    ``DataLoader(ds, batch_size=256 (SMALL) / 8 (LARGE), num_workers=0 | 2)``
                    (``persistent_workers=True`` with workers: steady state, the warm-up pass
                    absorbs worker start-up); default_collate.
* ``batched``       the client's batched mode: ``SampleCacheDataset(url, shuffle=True, batch_size=B)``
                    through ``DataLoader(ds, batch_size=None, num_workers=0 | 2)`` (same B);
                    ``--no-batched`` leaves these rows out.

This process runs torch with one intra-op thread (``--torch-threads``, see there).
The client runs with its defaults: it takes a lease on the epoch per iteration (and
worker), and near the end of a pass fetches epoch 1's manifest in the background
(which seals epoch 1 in the cache; epoch 0 is what every pass reads).

The client needs the daemon (manifest, leases), so the daemon runs (idle: the
whole source is cached) while the client rows are measured; the raw LMDB rows run
with it stopped.

MB/s counts the payload of ``x`` only (256 B or 1 MiB per sample), MB = 10**6 bytes.
The exit code is 1 when any pass failed verification.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from samplecache.launch import DaemonProcess
from samplecache.reader import open_cache
from samplecache.record import FORMAT_VERSION, BlockView, Schema, shard_prefix

BENCH_FORMAT = 1           # bump when the generated data or the build procedure changes
LARGE_STRIDE = 4096        # LARGE checksum: every 4096th float32 of x, as int32 bits
MB = 1e6


# --- datasets ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    name: str              # "small" | "large"
    samples: int
    row_group: int
    dtype: str             # numpy dtype of x's items
    width: int             # items per sample
    batch_size: int
    seed: int
    rows_per_file: int     # rows per Parquet file (a multiple of row_group)

    @property
    def payload(self) -> int:
        """Bytes of x per sample."""
        return self.width * np.dtype(self.dtype).itemsize

    def params(self) -> dict[str, Any]:
        return {"bench_format": BENCH_FORMAT, "record_format": FORMAT_VERSION, **asdict(self)}


class Check:
    """The checksum of x: the same definition per sample (numpy), per block (numpy) and per batch (torch)."""

    def __init__(self, spec: Spec) -> None:
        self.small = spec.dtype == "uint8"
        self.last = spec.width - 1

    def sample(self, x: np.ndarray) -> int:
        if self.small:
            return x.item(0) + x.item(self.last)
        return int(x.view(np.int32)[::LARGE_STRIDE].sum(dtype=np.int64))

    def block(self, xs: np.ndarray) -> int:
        """xs: (rows, width)."""
        if self.small:
            return int(xs[:, 0].sum(dtype=np.int64)) + int(xs[:, self.last].sum(dtype=np.int64))
        return int(xs.view(np.int32)[:, ::LARGE_STRIDE].sum(dtype=np.int64))

    def batch(self, x: Any) -> int:
        """x: a torch tensor (batch, width) from default_collate."""
        import torch
        if self.small:
            return int(x[:, 0].sum(dtype=torch.int64)) + int(x[:, self.last].sum(dtype=torch.int64))
        return int(x.view(torch.int32)[:, ::LARGE_STRIDE].sum(dtype=torch.int64))


def make_specs(n_small: int, n_large: int, quick: bool) -> dict[str, Spec]:
    """SMALL and LARGE (also used by benchmarks/suite.py: same parameters, so the same data and caches)."""
    return {
        # quick: smaller row groups so that every dataset still has several shards (workers split by shard)
        "small": Spec("small", n_small, 5_000 if quick else 50_000, "uint8", 256, 256, seed=1,
                      rows_per_file=(5_000 if quick else 50_000) * 4),
        "large": Spec("large", n_large, 16 if quick else 64, "float32", 262_144, 8, seed=2,
                      rows_per_file=(16 if quick else 64) * 8),
    }


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    tmp.replace(path)


def generate(spec: Spec, root: Path, log: Callable[[str], None]) -> dict[str, int]:
    """The Parquet dataset of ``spec`` under ``root/parquet`` (reused if the parameters match); its truth."""
    params_path, truth_path, pq_dir = root / "params.json", root / "truth.json", root / "parquet"
    truth = read_json(truth_path)
    if read_json(params_path) == spec.params() and truth is not None and pq_dir.is_dir():
        log(f"{spec.name}: reusing {pq_dir}")
        return truth
    if root.exists():
        shutil.rmtree(root)
    pq_dir.mkdir(parents=True)
    log(f"{spec.name}: generating {spec.samples:,} samples x {spec.payload:,} B in {pq_dir}")
    rng = np.random.default_rng(spec.seed)
    item = pa.from_numpy_dtype(np.dtype(spec.dtype))
    schema = pa.schema([("x", pa.list_(item, spec.width)), ("y", pa.int64())])
    check = Check(spec)
    y_sum = x_check = 0
    done, file_no = 0, 0
    t0 = time.perf_counter()
    while done < spec.samples:
        rows_in_file = min(spec.rows_per_file, spec.samples - done)
        path = pq_dir / f"part-{file_no:05d}.parquet"
        with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False,
                              write_statistics=False) as w:
            start = 0
            while start < rows_in_file:
                n = min(spec.row_group, rows_in_file - start)
                if spec.dtype == "uint8":
                    flat = rng.integers(0, 256, size=n * spec.width, dtype=np.uint8)
                else:  # random float32 in [0, 1): random mantissas, practically incompressible
                    flat = rng.random(n * spec.width, dtype=np.float32)
                y = rng.integers(0, 1 << 31, size=n, dtype=np.int64)
                x = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=item), spec.width)
                w.write_table(pa.Table.from_arrays([x, pa.array(y)], schema=schema), row_group_size=n)
                y_sum += int(y.sum())
                x_check += check.block(flat.reshape(n, spec.width))
                start += n
        done += rows_in_file
        file_no += 1
    truth = {"samples": spec.samples, "y_sum": y_sum, "x_check": x_check}
    write_json(truth_path, truth)
    write_json(params_path, spec.params())
    log(f"{spec.name}: generated in {time.perf_counter() - t0:.1f}s")
    return truth


# --- the daemon -------------------------------------------------------------------------------

def http_json(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def start_daemon(spec: Spec, root: Path) -> DaemonProcess:
    source = f"file://{(root / 'parquet').resolve()}"
    max_bytes = 2 * spec.samples * (spec.payload + 64) + (256 << 20)  # generous: nothing may be evicted
    d = DaemonProcess(source, (root / "cache").resolve(), log_path=root / "daemon.log",
                      extra=["--samplers", "2", "--max-bytes", str(max_bytes), "--log-level", "warning"])
    return d.start(timeout=120.0)


def stop_daemon(d: DaemonProcess) -> None:
    code = d.stop()
    if code not in (0, None):
        raise RuntimeError(f"daemon exited with code {code}:\n{d.log_tail()}")


def wait_cached(d: DaemonProcess, spec: Spec, log: Callable[[str], None]) -> None:
    """Until /v1/status reports every sample resident."""
    budget = 120.0 + spec.samples * spec.payload / 10e6  # >= 10 MB/s of ingest, plus start-up
    deadline = time.monotonic() + budget
    t0, last = time.monotonic(), -1.0
    while True:
        st = http_json(d.url + "/v1/status")
        if st["quarantined"]:
            raise RuntimeError(f"daemon quarantined files: {st['quarantined']}")
        if st["samples"] > spec.samples:
            raise RuntimeError(f"daemon holds {st['samples']} samples, more than the {spec.samples} of the source")
        if st["samples"] == spec.samples:
            log(f"{spec.name}: cached {st['samples']:,} samples, {st['bytes'] / MB:,.1f} MB, "
                f"{st['shards']} shards in {time.monotonic() - t0:.1f}s")
            return
        if d.proc is not None and d.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with code {d.proc.returncode}:\n{d.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{spec.name}: only {st['samples']} of {spec.samples} samples cached after "
                               f"{budget:.0f}s (last error: {st['last_error']})\n{d.log_tail()}")
        if time.monotonic() - last > 10:
            log(f"{spec.name}: {st['samples']:,} / {spec.samples:,} samples cached ({st['sampler']['state']})")
            last = time.monotonic()
        time.sleep(0.2)


def fetch_epoch0(d: DaemonProcess) -> dict[str, Any]:
    return http_json(d.url + "/v1/epochs/0?min_samples=1&timeout=30", timeout=90)  # type: ignore[no-any-return]


def build_cache(spec: Spec, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The cache of ``spec`` with epoch 0 sealed over every sample; its manifest. No daemon left running."""
    build_path, cache = root / "build.json", root / "cache"
    got = read_json(build_path)
    if got is not None and got.get("params") == spec.params() and (cache / "lmdb" / "data.mdb").exists():
        log(f"{spec.name}: reusing cache {cache}")
        return got["manifest"]  # type: ignore[no-any-return]
    if cache.exists():
        shutil.rmtree(cache)
    build_path.unlink(missing_ok=True)
    d = start_daemon(spec, root)
    try:
        wait_cached(d, spec, log)
        manifest = fetch_epoch0(d)
    finally:
        stop_daemon(d)
    if manifest["samples"] != spec.samples:
        raise RuntimeError(f"epoch 0 sealed with {manifest['samples']} samples, expected {spec.samples}")
    write_json(build_path, {"params": spec.params(), "manifest": manifest})
    return manifest


# --- measuring --------------------------------------------------------------------------------

@dataclass
class Tally:
    samples: int = 0
    y_sum: int = 0
    x_check: int = 0


@dataclass
class Row:
    loader: str
    dataset: str
    workers: int
    batch_size: int | None
    payload_bytes: int
    expected: dict[str, int]
    times_s: list[float] = field(default_factory=list)
    passes: list[dict[str, Any]] = field(default_factory=list)
    info: bool = False                 # informational row (not the limit, not a samplecache loader)
    error: str | None = None

    @property
    def verified(self) -> bool:
        return self.error is None and bool(self.passes) and all(p["ok"] for p in self.passes)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None

    @property
    def samples_per_s(self) -> float | None:
        m = self.median_s
        return self.expected["samples"] / m if m else None

    @property
    def mb_per_s(self) -> float | None:
        r = self.samples_per_s
        return r * self.payload_bytes / MB if r is not None else None


def measure(row: Row, one_pass: Callable[[], Tally], passes: int, log: Callable[[str], None]) -> Row:
    """One untimed warm-up pass, then ``passes`` timed ones; every pass verified."""
    try:
        for i in range(passes + 1):
            t0 = time.perf_counter()
            t = one_pass()
            dt = time.perf_counter() - t0
            got = {"samples": t.samples, "y_sum": t.y_sum, "x_check": t.x_check}
            ok = got == row.expected
            row.passes.append({"warmup": i == 0, "seconds": dt, "ok": ok,
                               **({} if ok else {"got": got})})
            if i > 0:
                row.times_s.append(dt)
            if not ok:
                log(f"  VERIFY FAILED {row.loader} {row.dataset} w={row.workers}: got {got}, expected {row.expected}")
    except Exception as e:  # reported in the table and the JSON; the other rows still run
        row.error = f"{type(e).__name__}: {e}"
        log(f"  ERROR {row.loader} {row.dataset} w={row.workers}: {row.error}")
    rate = row.samples_per_s
    log(f"  {row.loader:<11} {row.dataset:<6} w={row.workers} "
        f"{'-' if rate is None else f'{rate:,.0f} samples/s'}  passes {[round(t, 3) for t in row.times_s]}")
    return row


def lmdb_scan(manifest: dict[str, Any], per_sample: bool, check: Check) -> Tally:
    """The raw read: shard by shard of the manifest, every block, x copied once per sample (or per block)."""
    schema = Schema.from_json(manifest["schema"])
    cx, cy = schema.index("x"), schema.index("y")
    env, db = open_cache(manifest["lmdb_path"], int(manifest["map_size"]))  # the client's read-only handle
    n = ysum = xsum = 0
    with env.begin(buffers=True) as txn:
        cur = txn.cursor(db=db)
        for sid, rows, _bytes, _rpb in manifest["shards"]:
            prefix = shard_prefix(sid)
            got = 0
            if cur.set_range(prefix):
                for key, buf in cur:
                    if bytes(key[:8]) != prefix:
                        break
                    view = BlockView(buf, schema)
                    xs, ys = view.column_array(cx), view.column_array(cy)
                    if per_sample:
                        sample = check.sample
                        for x, y in zip(xs, ys.tolist()):
                            x = x.copy()
                            ysum += y
                            xsum += sample(x)
                    else:
                        xs = xs.copy()
                        ysum += int(ys.sum())
                        xsum += check.block(xs)
                    got += view.nrows
            if got != rows:
                raise RuntimeError(f"shard {sid}: {got} rows in LMDB, manifest says {rows}")
            n += got
    return Tally(n, ysum, xsum)


def client_pass(ds: Any, check: Check) -> Tally:
    ds.set_epoch(0)
    n = ysum = xsum = 0
    sample = check.sample
    for s in ds:
        n += 1
        ysum += int(s["y"])
        xsum += sample(s["x"])
    return Tally(n, ysum, xsum)


def loader_pass(ds: Any, loader: Any, check: Check) -> Tally:
    ds.set_epoch(0)
    n = ysum = xsum = 0
    for b in loader:
        y = b["y"]
        n += int(y.shape[0])
        ysum += int(y.sum())
        xsum += check.batch(b["x"])
    return Tally(n, ysum, xsum)


def client_without_daemon(url: str) -> str | None:
    """What iterating the client does once the daemon is gone: None if it reads, else the error."""
    from samplecache import SampleCacheDataset
    try:
        next(iter(SampleCacheDataset(url, retries=0, wait=1.0)))
    except Exception as e:  # expected: the manifest (and the lease) come from the daemon over HTTP
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


def measure_loader(url: str, spec: Spec, workers: int, check: Check, row: Row, passes: int,
                   log: Callable[[str], None], batched: bool = False) -> Row:
    """DataLoader over the per-sample dataset (default_collate), or over the batched one (batch_size=None)."""
    from torch.utils.data import DataLoader

    from samplecache import SampleCacheDataset

    if batched:
        ds = SampleCacheDataset(url, shuffle=True, batch_size=spec.batch_size)
        dl = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
    else:
        ds = SampleCacheDataset(url, shuffle=True)
        dl = DataLoader(ds, batch_size=spec.batch_size, num_workers=workers, persistent_workers=workers > 0)
    try:
        return measure(row, lambda: loader_pass(ds, dl, check), passes, log)
    finally:
        it = getattr(dl, "_iterator", None)  # persistent workers: stop them before the next row
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def run_dataset(spec: Spec, workdir: Path, passes: int, workers_list: list[int], batched: bool,
                log: Callable[[str], None]) -> tuple[list[Row], dict[str, Any]]:
    from samplecache import SampleCacheDataset

    root = (workdir / spec.name).resolve()
    truth = generate(spec, root, log)
    manifest = build_cache(spec, root, log)
    if manifest["samples"] != truth["samples"]:
        raise RuntimeError(f"manifest has {manifest['samples']} samples, the source {truth['samples']}")
    check = Check(spec)
    rows: list[Row] = []

    def row(loader: str, workers: int = 0, batch: int | None = None, info: bool = False) -> Row:
        return Row(loader, spec.name, workers, batch, spec.payload, dict(truth), info=info)

    # a. the LIMIT, and the block-copy ceiling: no daemon is running now
    log(f"{spec.name}: raw LMDB scans (daemon stopped)")
    rows.append(measure(row("lmdb-limit"), lambda: lmdb_scan(manifest, True, check), passes, log))
    rows.append(measure(row("lmdb-block", info=True), lambda: lmdb_scan(manifest, False, check), passes, log))

    # b, c. the client; it needs the daemon for the manifest
    d = start_daemon(spec, root)
    findings: dict[str, Any] = {}
    try:
        served = fetch_epoch0(d)
        if served.get("sealed_at") != manifest.get("sealed_at") or served["shards"] != manifest["shards"]:
            raise RuntimeError("the restarted daemon serves a different epoch 0 manifest than the one built")
        log(f"{spec.name}: samplecache client (daemon {d.url}, idle)")
        ds = SampleCacheDataset(d.url, shuffle=True)
        rows.append(measure(row("client"), lambda: client_pass(ds, check), passes, log))
        for w in workers_list:
            rows.append(measure_loader(d.url, spec, w, check, row("dataloader", w, spec.batch_size), passes, log))
        if batched:
            for w in workers_list:
                rows.append(measure_loader(d.url, spec, w, check, row("batched", w, spec.batch_size), passes, log,
                                           batched=True))
    finally:
        stop_daemon(d)
    err = client_without_daemon(d.url)
    findings["client_needs_daemon"] = err is not None
    findings["client_without_daemon_error"] = err
    findings["manifest"] = {"samples": manifest["samples"], "shards": len(manifest["shards"]),
                            "bytes": manifest["bytes"],
                            "rows_per_block": sorted({s[3] for s in manifest["shards"]})}
    return rows, findings


# --- output -----------------------------------------------------------------------------------

def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[Row]) -> str:
    head = f"{'loader':<12} {'dataset':<7} {'workers':>7} {'samples/s':>12} {'MB/s':>9} {'x limit':>8}  verified"
    lines = [head, "-" * len(head)]
    limits = {r.dataset: r.samples_per_s for r in rows if r.loader == "lmdb-limit"}
    for r in rows:
        lim = limits.get(r.dataset)
        ratio = r.samples_per_s / lim if (r.samples_per_s and lim) else None
        ok = "yes" if r.verified else ("ERROR" if r.error else "NO")
        lines.append(f"{r.loader:<12} {r.dataset:<7} {r.workers:>7} {fmt(r.samples_per_s, ',.0f'):>12} "
                     f"{fmt(r.mb_per_s, ',.1f'):>9} {fmt(ratio, '.2f'):>8}  {ok}")
    return "\n".join(lines)


def rows_json(rows: list[Row]) -> list[dict[str, Any]]:
    limits = {r.dataset: r.samples_per_s for r in rows if r.loader == "lmdb-limit"}
    out = []
    for r in rows:
        lim = limits.get(r.dataset)
        out.append({
            "loader": r.loader, "dataset": r.dataset, "workers": r.workers, "batch_size": r.batch_size,
            "informational": r.info, "samples": r.expected["samples"], "payload_bytes_per_sample": r.payload_bytes,
            "times_s": r.times_s, "median_s": r.median_s, "samples_per_s": r.samples_per_s,
            "mb_per_s": r.mb_per_s,
            "best_samples_per_s": (r.expected["samples"] / min(r.times_s)) if r.times_s else None,
            "ratio_to_limit": (r.samples_per_s / lim) if (r.samples_per_s and lim) else None,
            "verified": r.verified, "expected": r.expected, "passes": r.passes, "error": r.error,
        })
    return out


def sizes(a: argparse.Namespace, p: argparse.ArgumentParser) -> tuple[int, int, int]:
    """(SMALL samples, LARGE samples, timed passes) from ``--small/--large/--passes/--quick`` (also suite.py's)."""
    n_small = a.small if a.small is not None else (20_000 if a.quick else 400_000)
    n_large = a.large if a.large is not None else (64 if a.quick else 3_000)
    passes = a.passes if a.passes is not None else (1 if a.quick else 3)
    if n_small < 1 or n_large < 1 or passes < 1:
        p.error("--small, --large and --passes must be >= 1")
    return n_small, n_large, passes


def finish(path: Path | None, result: dict[str, Any], rows: list[Any]) -> int:
    """Write ``result`` as JSON to ``path`` (if given); the exit code: 0 when every row was verified."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
    return 0 if all(r.verified for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", type=int, default=None, help="SMALL samples (default 400000; --quick: 20000)")
    p.add_argument("--large", type=int, default=None, help="LARGE samples (default 3000; --quick: 64)")
    p.add_argument("--passes", type=int, default=None, help="timed passes per row (default 3; --quick: 1)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one pass (CI smoke run, < 60 s)")
    p.add_argument("--workdir", type=Path, default=Path("bench-data"), help="data and caches (default ./bench-data)")
    p.add_argument("--datasets", default="small,large", help="comma-separated subset of small,large")
    p.add_argument("--workers", default="0,2", help="DataLoader num_workers values (default 0,2)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads of this process (default 1; 0: torch's default). DataLoader "
                        "workers always use 1. With torch's default (one thread per core), default_collate's "
                        "torch.stack in this process turns erratic, up to 50x slower, when other processes "
                        "load the cores")
    p.add_argument("--no-batched", action="store_true",
                   help="leave out the rows of the client's batched mode (SampleCacheDataset(batch_size=B))")
    a = p.parse_args(argv)

    quick = a.quick
    n_small, n_large, passes = sizes(a, p)
    specs = make_specs(n_small, n_large, quick)
    names = [s.strip() for s in a.datasets.split(",") if s.strip()]
    if not names or any(n not in specs for n in names):
        p.error(f"--datasets takes a comma-separated subset of {sorted(specs)}")
    workers_list = [int(w) for w in a.workers.split(",") if w.strip()]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    import torch
    if a.torch_threads > 0:
        torch.set_num_threads(a.torch_threads)

    t0 = time.perf_counter()
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    a.workdir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    findings: dict[str, Any] = {}
    for name in names:
        r, f = run_dataset(specs[name], a.workdir, passes, workers_list, not a.no_batched, log)
        rows += r
        findings[name] = f

    print()
    print(table(rows))
    print(f"\nmedian of {passes} warm pass(es) after 1 warm-up; MB = 1e6 B of x payload; "
          f"'x limit' = samples/s / lmdb-limit samples/s (target >= 0.9); lmdb-block is informational")
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    result = {
        "benchmark": "read_throughput", "bench_format": BENCH_FORMAT, "quick": quick, "passes": passes,
        "seconds": time.perf_counter() - t0,
        "datasets": {n: specs[n].params() for n in names},
        "host": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                 "loadavg_start": load_start, "loadavg_end": load, "numpy": np.__version__, "pyarrow": pa.__version__,
                 "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "findings": findings,
        "rows": rows_json(rows),
    }
    return finish(a.json, result, rows)


if __name__ == "__main__":
    sys.exit(main())
