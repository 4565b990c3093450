"""samplecache against its peers: every loader on the same data, same machine, same run.

    python -m benchmarks.suite [--quick] [--passes 3] [--json out.json] [--md docs/benchmarks.md]
                               [--workdir DIR] [--datasets small,large] [--workers 0,2] [--loaders ...]

Peers are optional: ``bash benchmarks/install_peers.sh`` installs them into the running Python
without touching its torch (a peer that is missing is reported as "not installed", never dropped, with
the command that installs it; the other rows still run).

Data (``benchmarks.harness``: the generators and the cache build that ``benchmarks.read_throughput`` uses
too, same parameters, so both reuse each other's data under ``--workdir``):

* SMALL: 400,000 samples of ``x`` = 256 random uint8 + int64 ``y`` (``--quick``: 20,000);
* LARGE: 3,000 samples of ``x`` = 262,144 random float32 (1 MiB) + int64 ``y`` (``--quick``: 64).

The Parquet files are cached by the real daemon (``samplecache serve`` on a ``file://`` source) and
converted to each peer's local format (``benchmarks.suite.peers``): MDS shards (MosaicML Streaming),
LitData chunks, WebDataset tars, an LMDB of pickled samples; the pyarrow loader reads the Parquet
files themselves. Peer data, caches and temporary files stay under ``--workdir`` (``TMPDIR`` is
pointed there); Streaming's ``/dev/shm`` leftovers are removed after each of its rows.

Loaders (DataLoader batch size 256 for SMALL and 8 for LARGE, default collate, shuffle on,
``num_workers`` in ``--workers`` (0, 2), ``persistent_workers=True`` and fork with workers):

* ``lmdb-limit``           THE LIMIT: a raw read-only LMDB cursor scan of the samplecache cache, one
                           ``.copy()`` of ``x`` per sample (no DataLoader; workers 0 only).
* ``lmdb-block``           informational: the same scan copying whole blocks (no per-sample work).
* ``lmdb-shuffled``        informational: each shard's rows in a random order, ``x`` gathered by the reader's
                           vectorised kernel alone, 4,096 positions a call: the ceiling of a shuffled read.
* ``samplecache``          ``SampleCacheDataset(url, shuffle=True)`` per sample, ``DataLoader(batch_size=B)``.
* ``samplecache-batched``  ``SampleCacheDataset(url, shuffle=True, batch_size=B)``, ``DataLoader(batch_size=None)``.
* ``samplecache-loader``   the same batched dataset through ``samplecache.SampleCacheLoader(batch_size=None)``
                           (the client's DataLoader subclass: with workers, batches come back through its
                           reused shared-memory ring instead of one new shared-memory segment per tensor).
* ``samplecache-loader-ps`` the per-sample dataset of ``samplecache`` through
                           ``SampleCacheLoader(batch_size=B)``: the user's code is the per-sample one, and the
                           loader has the dataset make the (identical) batches by vectorised gathers.
* peers: ``lmdb-pickle`` (naive map-style LMDB + pickle, RandomSampler), ``parquet-arrow`` (pyarrow
  IterableDataset), ``streaming`` (MosaicML Streaming, local MDS), ``litdata`` (LitData, local chunks,
  StreamingDataLoader), ``webdataset`` (local tars); details in ``benchmarks.suite.peers``.

Every row: one untimed warm-up pass (warms the page cache and starts the persistent workers), then
``--passes`` timed passes (default 3), the median reported. EVERY pass is verified against the
Parquet ground truth: sample count, sum of labels, and a checksum over a strided subset of ``x``
(bytes 0 and 255 for SMALL, every 4096th float32 for LARGE) -- so no loader wins by skipping work.
A row with a failed pass is marked and the exit code is 1.

``x limit`` = samples/s over the lmdb-limit's; ``x best peer`` = samples/s over the best verified
peer at the same dataset and worker count (the peers: lmdb-pickle, parquet-arrow, streaming, litdata,
webdataset). MB/s counts x's payload only, MB = 10**6 B. The samplecache daemon runs (idle) only
during the samplecache rows.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..harness import (
    BENCH_FORMAT,
    Check,
    Row,
    Spec,
    batches_pass,
    build_cache,
    cli,
    fail,
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
    write_json,
)
from ..harness.cli import log
from . import peers as pe
from . import report as sr
from .report import LOADERS, PEERS, SAMPLECACHE

SUITE_FORMAT = 1
EXTERNAL = ("streaming", "litdata", "webdataset")  # peers that need an install (keys of harness.needs.NEEDS)
VERSIONS = ("mosaicml-streaming", "litdata", "webdataset", "lmdb", "pyarrow", "numpy", "torch")
WORKER_TIMEOUT_S = 600  # a DataLoader worker that sends nothing for this long fails the row (hangs)
BENCHMARKS = Path(__file__).resolve().parents[1]  # results/ here, docs/ beside it


@dataclass
class SuiteRow(Row):
    kind: str = "peer"               # limit | info | samplecache | peer


def dl_kwargs(workers: int) -> dict[str, Any]:
    if workers == 0:
        return {"num_workers": 0}
    return {"num_workers": workers, "persistent_workers": True, "multiprocessing_context": "fork",
            "timeout": WORKER_TIMEOUT_S}


def shutdown(loader: Any) -> None:
    it = getattr(loader, "_iterator", None)  # persistent workers: stop them before the next row
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    if hasattr(loader, "_iterator"):
        loader._iterator = None


def measure_loader(row: SuiteRow, make: Callable[[], tuple[Any, Callable[[], None] | None]], check: Check,
                   passes: int, after: Callable[[], None] | None = None) -> SuiteRow:
    """``make()`` -> (loader, called before each pass); the loader's workers are stopped afterwards."""
    loader: Any = None
    try:
        loader, before = make()
        measure(row, lambda: batches_pass(loader, check, before), passes, log)
    except Exception as e:  # construction failed; measure reports errors of the passes itself
        fail(row, e, log)
    finally:
        if loader is not None:
            shutdown(loader)
        # rebound rather than deleted: the pass's lambda reads the same name
        loader = None
        if after is not None:
            after()
    return row


class DatasetRun:
    """Every selected row of one dataset: the limit, the peers, then samplecache (its daemon running)."""

    def __init__(self, spec: Spec, workdir: Path, passes: int, workers: list[int], loaders: list[str]) -> None:
        self.spec, self.passes, self.workers, self.loaders = spec, passes, workers, loaders
        self.root = (workdir / spec.name).resolve()
        self.peer_dir = self.root / "peers"
        self.rows: list[SuiteRow] = []
        self.findings: dict[str, Any] = {}
        self.missing: dict[str, str] = {}

    def row(self, loader: str, kind: str, workers: int = 0, batch: int | None = None) -> SuiteRow:
        return SuiteRow(loader, self.spec.name, workers, batch, self.spec.payload, dict(self.truth),
                        info=kind == "info", kind=kind)

    def run(self) -> None:
        spec = self.spec
        self.truth = generate(spec, self.root, log)
        self.manifest = build_cache(spec, self.root, log)
        if self.manifest["samples"] != self.truth["samples"]:
            raise RuntimeError(f"manifest has {self.manifest['samples']} samples, the source {self.truth['samples']}")
        self.check = Check(spec)
        self.findings["manifest"] = {"samples": self.manifest["samples"], "shards": len(self.manifest["shards"]),
                                     "bytes": self.manifest["bytes"]}
        # the limit first, with no daemon running
        if "lmdb-limit" in self.loaders:
            log(f"{spec.name}: the limit (raw LMDB scan, daemon stopped)")
            self.rows.append(measure(self.row("lmdb-limit", "limit"),
                                     lambda: lmdb_scan(self.manifest, True, self.check), self.passes, log))
        if "lmdb-block" in self.loaders:
            self.rows.append(measure(self.row("lmdb-block", "info"),
                                     lambda: lmdb_scan(self.manifest, False, self.check), self.passes, log))
        if "lmdb-shuffled" in self.loaders:
            self.rows.append(measure(self.row("lmdb-shuffled", "info"),
                                     lambda: lmdb_scan(self.manifest, False, self.check, True), self.passes, log))
        for peer in [p for p in PEERS if p in self.loaders]:
            self.run_peer(peer)
        if any(s in self.loaders for s in SAMPLECACHE):
            self.run_samplecache()

    # -- peers ----------------------------------------------------------------------------------------
    def prepare(self, peer: str) -> Path | None:
        """The peer's local data (converted once, reused while the source is unchanged)."""
        spec, pq_dir, params = self.spec, self.root / "parquet", self.spec.params()
        args = (spec.samples, spec.payload, spec.width)
        out = self.peer_dir / peer
        writers: dict[str, tuple[str, Callable[[Path], None]]] = {
            "lmdb-pickle": (peer, lambda o: pe.write_lmdb_pickle(pq_dir, o, *args)),
            "streaming": ("streaming (MDS)", lambda o: pe.write_mds(pq_dir, o, *args, spec.dtype)),
            "litdata": (peer, lambda o: pe.write_litdata(pq_dir, o, *args)),
            "webdataset": (peer, lambda o: pe.write_wds(pq_dir, o, *args)),
        }
        if peer not in writers:
            return None  # parquet-arrow reads the source files
        what, write = writers[peer]
        return pe.converted(out, params, write, log, what)

    def run_peer(self, peer: str) -> None:
        spec = self.spec
        why = missing(peer) if peer in EXTERNAL else None
        if why is not None:
            self.missing[peer] = why
            for w in self.workers:
                self.rows.append(self.row(peer, "peer", w, spec.batch_size))
                self.rows[-1].missing = why
            log(f"{spec.name}: {peer}: {why}")
            return
        log(f"{spec.name}: {peer}")
        try:
            out = self.prepare(peer)
        except Exception as e:
            for w in self.workers:
                self.rows.append(fail(self.row(peer, "peer", w, spec.batch_size), e, log, "conversion failed: "))
            return
        for w in self.workers:
            self.rows.append(self.run_peer_row(peer, out, w))

    def run_peer_row(self, peer: str, out: Path | None, w: int) -> SuiteRow:
        import torch
        from torch.utils.data import DataLoader, RandomSampler

        spec, B, kw = self.spec, self.spec.batch_size, dl_kwargs(w)
        held: dict[str, Any] = {}
        shm = pe.StreamingShm() if peer == "streaming" else None

        def make() -> tuple[Any, Callable[[], None] | None]:
            if peer == "parquet-arrow":
                return DataLoader(pe.ParquetIterable(self.root / "parquet", spec.width), batch_size=B, **kw), None
            assert out is not None
            if peer == "lmdb-pickle":
                ds = pe.LmdbPickleDataset(out, spec.samples)
                sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(0))
                return DataLoader(ds, batch_size=B, sampler=sampler, **kw), None
            if peer == "streaming":
                held["ds"] = pe.mds_dataset(out, B)
                return DataLoader(held["ds"], batch_size=B, **kw), None
            if peer == "litdata":
                import litdata
                return litdata.StreamingDataLoader(pe.litdata_dataset(out), batch_size=B, **kw), None
            if peer == "webdataset":
                return DataLoader(pe.wds_dataset(out, spec.dtype, spec.payload), batch_size=B, **kw), None
            raise ValueError(peer)

        def after() -> None:
            if shm is not None:
                left = shm.release(held.pop("ds", None))
                if left:
                    self.findings.setdefault("streaming_leftovers_removed", []).extend(left)

        return measure_loader(self.row(peer, "peer", w, B), make, self.check, self.passes, after)

    # -- samplecache ----------------------------------------------------------------------------------
    def run_samplecache(self) -> None:
        from torch.utils.data import DataLoader

        from samplecache import SampleCacheDataset, SampleCacheLoader

        spec, B = self.spec, self.spec.batch_size
        d = serve(spec, self.root, self.manifest)
        try:
            log(f"{spec.name}: samplecache (daemon {d.url}, idle)")
            for loader in [s for s in SAMPLECACHE if s in self.loaders]:
                for w in self.workers:
                    def make(loader: str = loader, w: int = w) -> tuple[Any, Callable[[], None]]:
                        batched = loader in ("samplecache-batched", "samplecache-loader")
                        ds = SampleCacheDataset(d.url, shuffle=True, batch_size=B if batched else None)
                        cls = SampleCacheLoader if loader.startswith("samplecache-loader") else DataLoader
                        dl = cls(ds, batch_size=None if batched else B, **dl_kwargs(w))
                        return dl, lambda: ds.set_epoch(0)
                    self.rows.append(measure_loader(self.row(loader, "samplecache", w, B), make, self.check,
                                                    self.passes))
        finally:
            stop_daemon(d)


def peers_tmpdir(workdir: Path) -> None:
    """Peers' temporary files and locks (Streaming's file locks, LitData's) go under the workdir, unless its
    path is too long for the unix sockets multiprocessing makes there (108 bytes: DataLoader workers pass
    tensors' file descriptors through one; past that they fail and the loader waits forever): then a short
    dir in the temp dir, removed at exit."""
    tmp = workdir / "tmp"
    if len(str(tmp)) > 60:
        tmp = Path(tempfile.mkdtemp(prefix="scbench-"))
        atexit.register(shutil.rmtree, tmp, True)
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    p.prog = "python -m benchmarks.suite"
    cli.common(p, quick="CI smoke sizes, 1 timed pass (< 3 minutes)", json_help="write the results here (default "
               "benchmarks/results/suite.json; --quick: WORKDIR/suite-quick.json)")
    cli.loader_sizes(p)
    p.add_argument("--md", type=Path, default=None,
                   help="write the markdown page here (default docs/benchmarks.md; --quick: none)")
    p.add_argument("--no-md", action="store_true", help="write no markdown page")
    p.add_argument("--datasets", default="small,large", help="comma-separated subset of small,large")
    p.add_argument("--workers", default="0,2", help="DataLoader num_workers values (default 0,2)")
    p.add_argument("--loaders", default=",".join(LOADERS), help=f"comma-separated subset of {','.join(LOADERS)}")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads of this process (default 1, as read_throughput; 0: torch's default)")
    a = p.parse_args(argv)
    n_small, n_large, passes = cli.sizes(a, p)
    specs = make_specs(n_small, n_large, a.quick)
    names = cli.subset(p, "--datasets", a.datasets, list(specs))
    workers = cli.ints(p, "--workers", a.workers)
    loaders = cli.subset(p, "--loaders", a.loaders, LOADERS)
    workdir = a.workdir.resolve()
    json_path = a.json or (workdir / "suite-quick.json" if a.quick else BENCHMARKS / "results" / "suite.json")
    md_path = None if a.no_md else (a.md or (None if a.quick else BENCHMARKS.parent / "docs" / "benchmarks.md"))

    peers_tmpdir(workdir)
    # default_collate of a read-only numpy array (webdataset's np.frombuffer) warns once per process
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    import torch
    if a.torch_threads > 0:
        torch.set_num_threads(a.torch_threads)

    t0 = time.perf_counter()
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_start = report.loadavg()
    log(f"suite: {', '.join(names)}; workers {workers}; {passes} pass(es); load average {load_start}; "
        f"workdir {workdir}")
    rows: list[SuiteRow] = []
    findings: dict[str, Any] = {}
    gone: dict[str, str] = {}
    for name in names:
        run = DatasetRun(specs[name], workdir, passes, workers, loaders)
        try:
            run.run()
        finally:
            rows += run.rows
            findings[name] = run.findings
            gone.update(run.missing)

    print()
    print(sr.table(rows))
    print(f"\nmedian of {passes} warm pass(es) after 1 warm-up; MB = 1e6 B of x; 'x limit': over lmdb-limit "
          f"samples/s; 'x best peer': over the best verified peer at the same dataset and workers")
    ts = sr.targets(rows)
    print()
    print(sr.targets_text(ts, markdown=False))
    print_missing(gone)
    result = {
        "benchmark": "suite", "suite_format": SUITE_FORMAT, "bench_format": BENCH_FORMAT, "quick": a.quick,
        "passes": passes, "date": date, "seconds": time.perf_counter() - t0,
        "loadavg_start": load_start, "loadavg_end": report.loadavg(), "machine": report.machine(VERSIONS),
        "torch_threads": torch.get_num_threads(), "workers": workers, "loaders": loaders,
        "datasets": {n: specs[n].params() for n in names}, "findings": findings, "targets": ts,
        "missing": missing_report(gone), "rows": sr.rows_json(rows),
    }
    write_json(json_path, result)
    log(f"results: {json_path}")
    if md_path is not None:
        sr.write_markdown(md_path, result, rows, workers)
        log(f"markdown: {md_path}")
    return report.exit_code(rows)
