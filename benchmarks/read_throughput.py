"""Warm read throughput of samplecache against the raw LMDB limit.

    python -m benchmarks.read_throughput [--small N] [--large N] [--passes 3]
                                         [--json out.json] [--quick] [--workdir DIR]

Two datasets are generated as local Parquet (random, incompressible, written
uncompressed; ``benchmarks.harness.data``) and cached by the real daemon (``samplecache serve`` on a
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

import time
from pathlib import Path
from typing import Any

from .harness import (
    BENCH_FORMAT,
    Check,
    Row,
    Spec,
    Tally,
    batches_pass,
    build_cache,
    cli,
    fmt,
    generate,
    lmdb_scan,
    make_specs,
    measure,
    missing,
    missing_report,
    print_missing,
    report,
    serve,
    stop_daemon,
    text_table,
)
from .harness.cli import log

CLIENT_ROWS = ("client", "dataloader", "batched")


def client_pass(ds: Any, check: Check) -> Tally:
    ds.set_epoch(0)
    n = ysum = xsum = 0
    sample = check.sample
    for s in ds:
        n += 1
        ysum += int(s["y"])
        xsum += sample(s["x"])
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
                   batched: bool = False) -> Row:
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
        return measure(row, lambda: batches_pass(dl, check, lambda: ds.set_epoch(0)), passes, log)
    finally:
        it = getattr(dl, "_iterator", None)  # persistent workers: stop them before the next row
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def run_dataset(spec: Spec, workdir: Path, passes: int, workers_list: list[int], batched: bool,
                no_torch: str | None) -> tuple[list[Row], dict[str, Any]]:
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
    findings: dict[str, Any] = {"manifest": {"samples": manifest["samples"], "shards": len(manifest["shards"]),
                                             "bytes": manifest["bytes"],
                                             "rows_per_block": sorted({s[3] for s in manifest["shards"]})}}
    if no_torch is not None:  # the client rows need torch: reported as missing
        for name, ws in (("client", [0]), ("dataloader", workers_list), ("batched", workers_list if batched else [])):
            for w in ws:
                rows.append(row(name, w, None if name == "client" else spec.batch_size))
                rows[-1].missing = no_torch
        return rows, findings

    # b, c. the client; it needs the daemon for the manifest
    from samplecache import SampleCacheDataset

    d = serve(spec, root, manifest)
    try:
        log(f"{spec.name}: samplecache client (daemon {d.url}, idle)")
        ds = SampleCacheDataset(d.url, shuffle=True)
        rows.append(measure(row("client"), lambda: client_pass(ds, check), passes, log))
        for w in workers_list:
            rows.append(measure_loader(d.url, spec, w, check, row("dataloader", w, spec.batch_size), passes))
        if batched:
            for w in workers_list:
                rows.append(measure_loader(d.url, spec, w, check, row("batched", w, spec.batch_size), passes,
                                           batched=True))
    finally:
        stop_daemon(d)
    err = client_without_daemon(d.url)
    findings["client_needs_daemon"] = err is not None
    findings["client_without_daemon_error"] = err
    return rows, findings


def ratios(rows: list[Row]) -> dict[int, float | None]:
    """Row index -> samples/s over the lmdb-limit's of its dataset."""
    limits = {r.dataset: r.samples_per_s for r in rows if r.loader == "lmdb-limit"}
    return {i: (r.samples_per_s / lim if (r.samples_per_s and (lim := limits.get(r.dataset))) else None)
            for i, r in enumerate(rows)}


def table(rows: list[Row]) -> str:
    x = ratios(rows)
    head = [("loader", -12), ("dataset", -7), ("workers", 7), ("samples/s", 12), ("MB/s", 9), ("x limit", 8),
            (" verified", -9)]
    return text_table(head, [[(r.loader, -12), (r.dataset, -7), (str(r.workers), 7),
                              (fmt(r.samples_per_s, ',.0f'), 12), (fmt(r.mb_per_s, ',.1f'), 9),
                              (fmt(x[i], '.2f'), 8), (" " + r.status, -9)] for i, r in enumerate(rows)])


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    cli.common(p, quick="tiny sizes, one pass (CI smoke run, < 60 s)")
    cli.loader_sizes(p)
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
    n_small, n_large, passes = cli.sizes(a, p)
    specs = make_specs(n_small, n_large, a.quick)
    names = cli.subset(p, "--datasets", a.datasets, list(specs))
    workers_list = cli.ints(p, "--workers", a.workers)

    no_torch = missing("torch")
    versions = {}
    if no_torch is None:
        import torch
        if a.torch_threads > 0:
            torch.set_num_threads(a.torch_threads)
        versions = {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}

    t0, load_start = time.perf_counter(), report.loadavg()
    a.workdir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    findings: dict[str, Any] = {}
    for name in names:
        r, f = run_dataset(specs[name], a.workdir, passes, workers_list, not a.no_batched, no_torch)
        rows += r
        findings[name] = f

    gone = {"torch": no_torch} if no_torch else {}
    print()
    print(table(rows))
    print(f"\nmedian of {passes} warm pass(es) after 1 warm-up; MB = 1e6 B of x payload; "
          f"'x limit' = samples/s / lmdb-limit samples/s (target >= 0.9); lmdb-block is informational")
    print_missing(gone)
    result = {
        "benchmark": "read_throughput", "bench_format": BENCH_FORMAT, "quick": a.quick, "passes": passes,
        "seconds": time.perf_counter() - t0,
        "datasets": {n: specs[n].params() for n in names},
        "host": report.host(load_start, ("numpy", "pyarrow"), **versions),
        "findings": findings, "missing": missing_report(gone),
        "rows": report.rows_json(rows, ratios(rows)),
    }
    return report.finish(a.json, result, rows)

if __name__ == "__main__":
    raise SystemExit(main())
