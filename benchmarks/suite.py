#!/usr/bin/env python
"""samplecache against its peers: every loader on the same data, same machine, same run.

    python benchmarks/suite.py [--quick] [--passes 3] [--json out.json] [--md docs/benchmarks.md]
                               [--workdir DIR] [--datasets small,large] [--workers 0,2] [--loaders ...]

Peers are optional: ``bash benchmarks/install_peers.sh`` installs them into the running Python
without touching its torch (a peer that is missing is reported as "not installed", never dropped).

Data (the generators and the cache build of ``benchmarks/read_throughput.py``, same parameters, so
both scripts reuse each other's data under ``--workdir``):

* SMALL: 400,000 samples of ``x`` = 256 random uint8 + int64 ``y`` (``--quick``: 20,000);
* LARGE: 3,000 samples of ``x`` = 262,144 random float32 (1 MiB) + int64 ``y`` (``--quick``: 64).

The Parquet files are cached by the real daemon (``samplecache serve`` on a ``file://`` source) and
converted to each peer's local format (``benchmarks/peers.py``): MDS shards (MosaicML Streaming),
LitData chunks, WebDataset tars, an LMDB of pickled samples; the pyarrow loader reads the Parquet
files themselves. Peer data, caches and temporary files stay under ``--workdir`` (``TMPDIR`` is
pointed there); Streaming's ``/dev/shm`` leftovers are removed after each of its rows.

Loaders (DataLoader batch size 256 for SMALL and 8 for LARGE, default collate, shuffle on,
``num_workers`` in ``--workers`` (0, 2), ``persistent_workers=True`` and fork with workers):

* ``lmdb-limit``           THE LIMIT: a raw read-only LMDB cursor scan of the samplecache cache, one
                           ``.copy()`` of ``x`` per sample (no DataLoader; workers 0 only).
* ``lmdb-block``           informational: the same scan copying whole blocks (no per-sample work).
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
  StreamingDataLoader), ``webdataset`` (local tars); details in ``benchmarks/peers.py``.

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

import argparse
import atexit
import datetime as _dt
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import peers as pe  # noqa: E402
import read_throughput as rt  # noqa: E402

SUITE_FORMAT = 1
PEERS = ["lmdb-pickle", "parquet-arrow", "streaming", "litdata", "webdataset"]
SAMPLECACHE = ["samplecache", "samplecache-batched", "samplecache-loader", "samplecache-loader-ps"]
LOADERS = ["lmdb-limit", "lmdb-block", *SAMPLECACHE, *PEERS]
EXTERNAL = {"streaming": "streaming", "litdata": "litdata", "webdataset": "webdataset"}  # loader -> pe.missing key
WORKER_TIMEOUT_S = 600  # a DataLoader worker that sends nothing for this long fails the row (hangs)


@dataclass
class SuiteRow(rt.Row):
    kind: str = "peer"               # limit | info | samplecache | peer
    missing: str | None = None       # "not installed (...)": the peer could not be imported

    @property
    def status(self) -> str:
        if self.missing:
            return "not installed"
        if self.error:
            return "ERROR"
        return "yes" if self.verified else "NO"


# --- one pass of a DataLoader ------------------------------------------------------------------------

def batches_pass(loader: Any, check: rt.Check, before: Callable[[], None] | None = None) -> rt.Tally:
    if before is not None:
        before()
    n = ysum = xsum = 0
    for b in loader:
        y = b["y"]
        n += int(y.shape[0])
        ysum += int(y.sum())
        xsum += check.batch(b["x"])
    return rt.Tally(n, ysum, xsum)


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


def measure_loader(row: SuiteRow, make: Callable[[], tuple[Any, Callable[[], None] | None]], check: rt.Check,
                   passes: int, log: Callable[[str], None], after: Callable[[], None] | None = None) -> SuiteRow:
    """``make()`` -> (loader, called before each pass); the loader's workers are stopped afterwards."""
    loader: Any = None
    try:
        loader, before = make()
        rt.measure(row, lambda: batches_pass(loader, check, before), passes, log)
    except Exception as e:  # construction failed; rt.measure reports errors of the passes itself
        row.error = f"{type(e).__name__}: {e}"
        log(f"  ERROR {row.loader} {row.dataset} w={row.workers}: {row.error}")
    finally:
        if loader is not None:
            shutdown(loader)
        del loader
        if after is not None:
            after()
    return row


# --- the rows of one dataset --------------------------------------------------------------------------

class DatasetRun:
    def __init__(self, spec: rt.Spec, workdir: Path, passes: int, workers: list[int], loaders: list[str],
                 log: Callable[[str], None]) -> None:
        self.spec, self.passes, self.workers, self.loaders, self.log = spec, passes, workers, loaders, log
        self.root = (workdir / spec.name).resolve()
        self.peer_dir = self.root / "peers"
        self.rows: list[SuiteRow] = []
        self.findings: dict[str, Any] = {}

    def row(self, loader: str, kind: str, workers: int = 0, batch: int | None = None) -> SuiteRow:
        return SuiteRow(loader, self.spec.name, workers, batch, self.spec.payload, dict(self.truth),
                        info=kind == "info", kind=kind)

    def run(self) -> None:
        spec, log = self.spec, self.log
        self.truth = {k: v for k, v in rt.generate(spec, self.root, log).items() if k in ("samples", "y_sum", "x_check")}
        self.manifest = rt.build_cache(spec, self.root, log)
        if self.manifest["samples"] != self.truth["samples"]:
            raise RuntimeError(f"manifest has {self.manifest['samples']} samples, the source {self.truth['samples']}")
        self.check = rt.Check(spec)
        self.findings["manifest"] = {"samples": self.manifest["samples"], "shards": len(self.manifest["shards"]),
                                     "bytes": self.manifest["bytes"]}
        # the limit first, with no daemon running
        if "lmdb-limit" in self.loaders:
            log(f"{spec.name}: the limit (raw LMDB scan, daemon stopped)")
            self.rows.append(rt.measure(self.row("lmdb-limit", "limit"),
                                        lambda: rt.lmdb_scan(self.manifest, True, self.check), self.passes, log))
        if "lmdb-block" in self.loaders:
            self.rows.append(rt.measure(self.row("lmdb-block", "info"),
                                        lambda: rt.lmdb_scan(self.manifest, False, self.check), self.passes, log))
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
        if peer == "lmdb-pickle":
            return pe.converted(out, params, lambda o: pe.write_lmdb_pickle(pq_dir, o, *args), self.log, peer)
        if peer == "streaming":
            return pe.converted(out, params, lambda o: pe.write_mds(pq_dir, o, *args, spec.dtype), self.log,
                                "streaming (MDS)")
        if peer == "litdata":
            return pe.converted(out, params, lambda o: pe.write_litdata(pq_dir, o, *args), self.log, peer)
        if peer == "webdataset":
            return pe.converted(out, params, lambda o: pe.write_wds(pq_dir, o, *args), self.log, peer)
        return None  # parquet-arrow reads the source files

    def run_peer(self, peer: str) -> None:
        spec, log = self.spec, self.log
        why = pe.missing(EXTERNAL[peer]) if peer in EXTERNAL else None
        if why is not None:
            for w in self.workers:
                r = self.row(peer, "peer", w, spec.batch_size)
                r.missing = why
                self.rows.append(r)
            log(f"{spec.name}: {peer}: {why}")
            return
        log(f"{spec.name}: {peer}")
        try:
            out = self.prepare(peer)
        except Exception as e:
            for w in self.workers:
                r = self.row(peer, "peer", w, spec.batch_size)
                r.error = f"conversion failed: {type(e).__name__}: {e}"
                self.rows.append(r)
            log(f"  ERROR {peer} {spec.name}: conversion failed: {type(e).__name__}: {e}")
            return
        for w in self.workers:
            self.rows.append(self.run_peer_row(peer, out, w))

    def run_peer_row(self, peer: str, out: Path | None, w: int) -> SuiteRow:
        from torch.utils.data import DataLoader, RandomSampler

        spec, B, kw = self.spec, self.spec.batch_size, dl_kwargs(w)
        row = self.row(peer, "peer", w, B)
        held: dict[str, Any] = {}
        shm: pe.StreamingShm | None = None

        def make() -> tuple[Any, Callable[[], None] | None]:
            if peer == "lmdb-pickle":
                assert out is not None
                ds = pe.LmdbPickleDataset(out, spec.samples)
                import torch
                return DataLoader(ds, batch_size=B, sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(0)),
                                  **kw), None
            if peer == "parquet-arrow":
                return DataLoader(pe.ParquetIterable(self.root / "parquet", spec.width), batch_size=B, **kw), None
            if peer == "streaming":
                assert out is not None
                held["ds"] = pe.mds_dataset(out, B)
                return DataLoader(held["ds"], batch_size=B, **kw), None
            if peer == "litdata":
                import litdata
                assert out is not None
                return litdata.StreamingDataLoader(pe.litdata_dataset(out), batch_size=B, **kw), None
            if peer == "webdataset":
                assert out is not None
                return DataLoader(pe.wds_dataset(out, spec.dtype, spec.payload), batch_size=B, **kw), None
            raise ValueError(peer)

        def after() -> None:
            if shm is not None:
                left = shm.release(held.pop("ds", None))
                if left:
                    self.findings.setdefault("streaming_leftovers_removed", []).extend(left)

        if peer == "streaming":
            shm = pe.StreamingShm()
        return measure_loader(row, make, self.check, self.passes, self.log, after)

    # -- samplecache ----------------------------------------------------------------------------------
    def run_samplecache(self) -> None:
        from torch.utils.data import DataLoader

        from samplecache import SampleCacheDataset

        spec, log, B = self.spec, self.log, self.spec.batch_size
        d = rt.start_daemon(spec, self.root)
        try:
            served = rt.fetch_epoch0(d)
            if served.get("sealed_at") != self.manifest.get("sealed_at") or served["shards"] != self.manifest["shards"]:
                raise RuntimeError("the restarted daemon serves a different epoch 0 manifest than the one built")
            log(f"{spec.name}: samplecache (daemon {d.url}, idle)")
            for loader in [s for s in SAMPLECACHE if s in self.loaders]:
                for w in self.workers:
                    def make(loader: str = loader, w: int = w) -> tuple[Any, Callable[[], None]]:
                        if loader == "samplecache-batched":
                            ds = SampleCacheDataset(d.url, shuffle=True, batch_size=B)
                            dl = DataLoader(ds, batch_size=None, **dl_kwargs(w))
                        elif loader == "samplecache-loader":
                            from samplecache import SampleCacheLoader
                            ds = SampleCacheDataset(d.url, shuffle=True, batch_size=B)
                            dl = SampleCacheLoader(ds, batch_size=None, **dl_kwargs(w))
                        elif loader == "samplecache-loader-ps":
                            from samplecache import SampleCacheLoader
                            ds = SampleCacheDataset(d.url, shuffle=True)
                            dl = SampleCacheLoader(ds, batch_size=B, **dl_kwargs(w))
                        else:
                            ds = SampleCacheDataset(d.url, shuffle=True)
                            dl = DataLoader(ds, batch_size=B, **dl_kwargs(w))
                        return dl, lambda: ds.set_epoch(0)
                    self.rows.append(measure_loader(self.row(loader, "samplecache", w, B), make, self.check,
                                                    self.passes, log))
        finally:
            rt.stop_daemon(d)


# --- ratios, table, JSON, markdown --------------------------------------------------------------------

def ratios(rows: list[SuiteRow]) -> dict[int, dict[str, float | None]]:
    """id(row) -> {"limit": x limit, "peer": x best peer, "best_peer": name}."""
    limit = {r.dataset: r.samples_per_s for r in rows if r.loader == "lmdb-limit" and r.verified}
    best: dict[tuple[str, int], SuiteRow] = {}
    for r in rows:
        if r.kind == "peer" and r.verified and r.samples_per_s:
            k = (r.dataset, r.workers)
            if k not in best or r.samples_per_s > (best[k].samples_per_s or 0):
                best[k] = r
    out: dict[int, dict[str, Any]] = {}
    for r in rows:
        rate = r.samples_per_s if r.verified else None
        lim = limit.get(r.dataset)
        b = best.get((r.dataset, r.workers))
        out[id(r)] = {"limit": rate / lim if (rate and lim) else None,
                      "peer": rate / b.samples_per_s if (rate and b is not None and b.samples_per_s) else None,
                      "best_peer": b.loader if b is not None else None}
    return out


# issue 5's targets: (what, dataset, workers, samplecache rows (the best of them counts), against, minimum)
TARGETS = [
    ("LARGE w=0: samplecache vs the limit", "large", 0, SAMPLECACHE, "limit", 0.9),
    ("LARGE w=0: samplecache vs the best peer", "large", 0, SAMPLECACHE, "peer", 3.0),
    ("LARGE w=2: samplecache vs the best peer", "large", 2, SAMPLECACHE, "peer", 3.0),
    ("SMALL w=0: batched vs the best peer", "small", 0, ["samplecache-batched", "samplecache-loader"], "peer", 5.0),
    ("SMALL w=2: batched vs the best peer", "small", 2, ["samplecache-batched", "samplecache-loader"], "peer", 5.0),
    ("SMALL w=0: per-sample vs the best peer", "small", 0, ["samplecache", "samplecache-loader-ps"], "peer", 1.5),
    ("SMALL w=2: per-sample vs the best peer", "small", 2, ["samplecache", "samplecache-loader-ps"], "peer", 1.5),
]


def targets(rows: list[SuiteRow]) -> list[dict[str, Any]]:
    """The issue's target ratios as measured in this run (the best samplecache row of each group)."""
    rat = ratios(rows)
    out = []
    for what, dataset, workers, loaders, against, minimum in TARGETS:
        cands = [(rat[id(r)][against], r.loader) for r in rows
                 if r.dataset == dataset and r.workers == workers and r.loader in loaders
                 and rat[id(r)][against] is not None]
        got, loader = max(cands) if cands else (None, None)
        best = next((rat[id(r)]["best_peer"] for r in rows if r.dataset == dataset and r.workers == workers), None)
        out.append({"target": what, "dataset": dataset, "workers": workers, "loader": loader,
                    "against": "lmdb-limit" if against == "limit" else best, "ratio": got, "minimum": minimum,
                    "met": None if got is None else got >= minimum})
    return out


def targets_text(ts: list[dict[str, Any]], markdown: bool) -> str:
    lines = (["| target | samplecache row | against | ratio | needed | met |", "|---|---|---|---:|---:|---|"]
             if markdown else [f"{'target':<40} {'row':<20} {'against':<14} {'ratio':>6} {'needed':>6}  met"])
    for t in ts:
        met = "-" if t["met"] is None else ("yes" if t["met"] else "NO")
        cells = [t["target"], t["loader"] or "-", t["against"] or "-", fmt(t["ratio"], ".2f"), f"{t['minimum']:.1f}", met]
        if markdown:
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(f"{cells[0]:<40} {cells[1]:<20} {cells[2]:<14} {cells[3]:>6} {cells[4]:>6}  {cells[5]}")
    return "\n".join(lines)


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def human_rate(r: SuiteRow) -> tuple[str, str]:
    s, mb = r.samples_per_s, r.mb_per_s
    if not r.verified:
        s = mb = None
    return fmt(s, ",.0f"), fmt(mb, ",.1f")


def ordered(rows: list[SuiteRow]) -> list[SuiteRow]:
    order = {n: i for i, n in enumerate(LOADERS)}
    ds_order = {"small": 0, "large": 1}
    return sorted(rows, key=lambda r: (ds_order.get(r.dataset, 9), r.workers, order.get(r.loader, 99)))


def table(rows: list[SuiteRow]) -> str:
    rat = ratios(rows)
    head = (f"{'dataset':<7} {'workers':>7}  {'loader':<20} {'samples/s':>12} {'MB/s':>10} {'x limit':>8} "
            f"{'x best peer':>11}  verified")
    lines = [head, "-" * len(head)]
    for r in ordered(rows):
        s, mb = human_rate(r)
        q = rat[id(r)]
        name = r.loader + (" (limit)" if r.kind == "limit" else " (info)" if r.kind == "info" else "")
        lines.append(f"{r.dataset:<7} {r.workers:>7}  {name:<20} {s:>12} {mb:>10} {fmt(q['limit'], '.2f'):>8} "
                     f"{fmt(q['peer'], '.2f'):>11}  {r.status}")
    return "\n".join(lines)


def markdown_table(rows: list[SuiteRow]) -> str:
    rat = ratios(rows)
    lines = ["| dataset | workers | loader | samples/s | MB/s | x limit | x best peer | verified |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in ordered(rows):
        s, mb = human_rate(r)
        q = rat[id(r)]
        name = f"**{r.loader}**" if r.kind == "samplecache" else r.loader
        name += " (limit)" if r.kind == "limit" else " (info)" if r.kind == "info" else ""
        status = r.status if not r.error else f"ERROR: {r.error[:80]}"
        lines.append(f"| {r.dataset.upper()} | {r.workers} | {name} | {s} | {mb} | {fmt(q['limit'], '.2f')} | "
                     f"{fmt(q['peer'], '.2f')} | {status} |")
    return "\n".join(lines)


def pivot(rows: list[SuiteRow], workers: list[int]) -> str:
    """Loader x (dataset, workers): samples/s for SMALL, GB/s for LARGE (the calibration table's layout)."""
    cols = [(d, w) for d in ("small", "large") for w in workers if any(r.dataset == d for r in rows)]
    lines = ["| loader | " + " | ".join(f"{d.upper()} w={w}" for d, w in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for name in LOADERS:
        got = {(r.dataset, r.workers): r for r in rows if r.loader == name}
        if not got:
            continue
        cells = []
        for d, w in cols:
            r = got.get((d, w))
            if r is None:
                cells.append("—")
            elif r.missing:
                cells.append("not installed")
            elif not r.verified:
                cells.append("FAILED")
            elif d == "large":
                cells.append(f"{(r.mb_per_s or 0) / 1000:.2f} GB/s")
            else:
                v = r.samples_per_s or 0
                cells.append(f"{v / 1e6:.2f} M/s" if v >= 1e6 else f"{v / 1e3:.0f} k/s")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cores": os.cpu_count()}
    try:
        info["cores_usable"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
                break
    except (OSError, ValueError):
        pass
    info["versions"] = pe.versions()
    info["git"] = git_state()
    return info


def git_state() -> str | None:
    """The checkout's commit (``+dirty`` with uncommitted changes): which client the samplecache rows ran."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "client", "service"],
                               cwd=HERE.parent, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def rows_json(rows: list[SuiteRow]) -> list[dict[str, Any]]:
    rat = ratios(rows)
    out = []
    for r in ordered(rows):
        q = rat[id(r)]
        out.append({
            "loader": r.loader, "kind": r.kind, "dataset": r.dataset, "workers": r.workers,
            "batch_size": r.batch_size, "status": r.status, "missing": r.missing, "error": r.error,
            "samples": r.expected["samples"], "payload_bytes_per_sample": r.payload_bytes,
            "times_s": r.times_s, "median_s": r.median_s,
            "samples_per_s": r.samples_per_s if r.verified else None,
            "mb_per_s": r.mb_per_s if r.verified else None,
            "ratio_to_limit": q["limit"], "ratio_to_best_peer": q["peer"], "best_peer": q["best_peer"],
            "verified": r.verified, "expected": r.expected, "passes": r.passes,
        })
    return out


KEPT = "<!-- kept: sections below are written by other benchmarks (benchmarks/suite.py keeps them) -->"


def write_markdown(path: Path, result: dict[str, Any], rows: list[SuiteRow], workers: list[int]) -> None:
    m, ds = result["machine"], result["datasets"]
    v = m.get("versions", {})
    sizes = ", ".join(f"{n.upper()} = {d['samples']:,} samples x {d['width'] * np.dtype(d['dtype']).itemsize:,} B "
                      f"(batch {d['batch_size']})" for n, d in ds.items())
    text = f"""# Benchmarks: samplecache against its peers

<!-- written by `python benchmarks/suite.py` (the results below are replaced on every full run) -->

One command generates the data, converts it to every peer's format, runs every loader and writes
this page and a JSON file:

```
bash benchmarks/install_peers.sh          # optional peers, without touching the pinned torch
python benchmarks/suite.py                # full size: about 20 minutes on 2 cores
python benchmarks/suite.py --quick        # CI smoke sizes (< 3 minutes), every row still verified
```

Method (details in the docstrings of `benchmarks/suite.py` and `benchmarks/peers.py`):

* Data: random, incompressible; SMALL = 256-byte uint8 array + int64 label, LARGE = 1 MiB float32
  array + int64 label. The same Parquet files are cached by the real daemon (samplecache) and
  converted to MDS (MosaicML Streaming), LitData chunks, WebDataset tars and an LMDB of pickled
  samples; the pyarrow loader reads the Parquet files.
* Every loader goes through a PyTorch DataLoader with the same batch size (SMALL 256, LARGE 8),
  default collate, shuffle on, `num_workers` 0 and 2 (persistent, forked); the limit is a raw
  read-only LMDB cursor scan of the samplecache cache with one copy per sample, in-process.
* samplecache rows: `samplecache` = per-sample `SampleCacheDataset` + `DataLoader(batch_size=B)`;
  `samplecache-batched` = `SampleCacheDataset(batch_size=B)` + `DataLoader(batch_size=None)`;
  `samplecache-loader` = the same batched dataset through `SampleCacheLoader(batch_size=None)`
  (the client's DataLoader subclass, which brings worker batches back through a shared-memory ring);
  `samplecache-loader-ps` = the per-sample dataset through `SampleCacheLoader(batch_size=B)` (which has
  the dataset make the same batches by vectorised gathers).
* In-process (`num_workers` 0) samplecache copies a batch of large samples on all usable cores (numpy
  releases the GIL; `copy_threads`); the limit and the peers copy on one. With workers each worker
  copies on one core and the trainer takes zero-copy views of the ring.
* Warm page cache: one untimed warm-up pass, then the median of the timed passes.
* Every pass (warm-up included) is verified: sample count, sum of labels and a checksum over a
  strided subset of every sample's `x`, against the ground truth from the Parquet data.
* `x limit` = samples/s over the limit's; `x best peer` = samples/s over the best verified peer
  (lmdb-pickle, parquet-arrow, streaming, litdata, webdataset) at the same dataset and workers.
  MB/s counts `x` only (MB = 10^6 B).
* MosaicML Streaming imports torchvision and transformers from its package `__init__`s; the
  suite imports only `streaming.base.dataset` and the MDS writer (see `benchmarks/peers.py`), so
  neither is needed.

## Latest run

* date: {result['date']}
* machine: {m.get('cpu', '?')}, {m.get('cores')} cores, {m.get('ram_gib', '?')} GiB RAM; {m.get('platform')}
* samplecache: git {m.get('git') or '?'} (`+dirty`: uncommitted changes under client/ or service/)
* python {m.get('python')}, torch {v.get('torch')}, numpy {v.get('numpy')}, pyarrow {v.get('pyarrow')}, lmdb {v.get('lmdb')};
  mosaicml-streaming {v.get('mosaicml-streaming') or 'not installed'}, litdata {v.get('litdata') or 'not installed'},
  webdataset {v.get('webdataset') or 'not installed'}
* load average (1, 5, 15 min) at start {result['loadavg_start']}, at end {result['loadavg_end']}
* data: {sizes}; {result['passes']} timed pass(es) per row{' (QUICK sizes: not representative)' if result['quick'] else ''}
* suite time: {result['seconds']:.0f} s

{pivot(rows, workers)}

Issue 5's targets, as measured in this run (the best samplecache row of each group; ratios of samples/s):

{targets_text(result["targets"], markdown=True)}

All rows:

{markdown_table(rows)}
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.exists() else ""
    at = old.find(KEPT)  # sections written by other benchmarks (tf_feed.py, feed.py) stay as they are
    text += "\n" + (old[at:] if at >= 0 else KEPT + "\n")
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# --- main -------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="CI smoke sizes, 1 timed pass (< 3 minutes)")
    p.add_argument("--small", type=int, default=None, help="SMALL samples (default 400000; --quick: 20000)")
    p.add_argument("--large", type=int, default=None, help="LARGE samples (default 3000; --quick: 64)")
    p.add_argument("--passes", type=int, default=None, help="timed passes per row (default 3; --quick: 1)")
    p.add_argument("--json", type=Path, default=None,
                   help="write the results here (default benchmarks/results/suite.json; --quick: WORKDIR/suite-quick.json)")
    p.add_argument("--md", type=Path, default=None,
                   help="write the markdown page here (default docs/benchmarks.md; --quick: none)")
    p.add_argument("--no-md", action="store_true", help="write no markdown page")
    p.add_argument("--workdir", type=Path, default=Path("bench-data"),
                   help="data, caches, peer formats, TMPDIR (default ./bench-data, shared with read_throughput.py)")
    p.add_argument("--datasets", default="small,large", help="comma-separated subset of small,large")
    p.add_argument("--workers", default="0,2", help="DataLoader num_workers values (default 0,2)")
    p.add_argument("--loaders", default=",".join(LOADERS), help=f"comma-separated subset of {','.join(LOADERS)}")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads of this process (default 1, as read_throughput.py; 0: torch's default)")
    a = p.parse_args(argv)

    quick = a.quick
    n_small, n_large, passes = rt.sizes(a, p)
    specs = rt.make_specs(n_small, n_large, quick)
    names = [s.strip() for s in a.datasets.split(",") if s.strip()]
    if not names or any(n not in specs for n in names):
        p.error(f"--datasets takes a comma-separated subset of {sorted(specs)}")
    workers = [int(w) for w in a.workers.split(",") if w.strip()]
    loaders = [s.strip() for s in a.loaders.split(",") if s.strip()]
    if any(x not in LOADERS for x in loaders):
        p.error(f"--loaders takes a comma-separated subset of {','.join(LOADERS)}")
    workdir = a.workdir.resolve()
    json_path = a.json if a.json is not None else (workdir / "suite-quick.json" if quick
                                                   else HERE / "results" / "suite.json")
    md_path = None if a.no_md else (a.md if a.md is not None else (None if quick else HERE.parent / "docs" / "benchmarks.md"))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    # peers' temporary files and locks (Streaming's file locks, LitData's) go under the workdir, unless its path
    # is too long for the unix sockets multiprocessing makes there (108 bytes: DataLoader workers pass tensors'
    # file descriptors through one; past that they fail and the loader waits forever): then a short dir in the
    # temp dir, removed at exit
    tmp = workdir / "tmp"
    if len(str(tmp)) > 60:
        tmp = Path(tempfile.mkdtemp(prefix="scbench-"))
        atexit.register(shutil.rmtree, tmp, True)
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None
    # default_collate of a read-only numpy array (webdataset's np.frombuffer) warns once per process
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    import torch
    if a.torch_threads > 0:
        torch.set_num_threads(a.torch_threads)

    t0 = time.perf_counter()
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_start = loadavg()
    log(f"suite: {', '.join(names)}; workers {workers}; {passes} pass(es); load average {load_start}; "
        f"workdir {workdir}")
    rows: list[SuiteRow] = []
    findings: dict[str, Any] = {}
    for name in names:
        run = DatasetRun(specs[name], workdir, passes, workers, loaders, log)
        try:
            run.run()
        finally:
            rows += run.rows
            findings[name] = run.findings

    print()
    print(table(rows))
    print(f"\nmedian of {passes} warm pass(es) after 1 warm-up; MB = 1e6 B of x; 'x limit': over lmdb-limit "
          f"samples/s; 'x best peer': over the best verified peer at the same dataset and workers")
    ts = targets(rows)
    print()
    print(targets_text(ts, markdown=False))
    result = {
        "benchmark": "suite", "suite_format": SUITE_FORMAT, "bench_format": rt.BENCH_FORMAT, "quick": quick,
        "passes": passes, "date": date, "seconds": time.perf_counter() - t0,
        "loadavg_start": load_start, "loadavg_end": loadavg(), "machine": machine(),
        "torch_threads": torch.get_num_threads(), "workers": workers, "loaders": loaders,
        "datasets": {n: specs[n].params() for n in names}, "findings": findings, "targets": ts,
        "rows": rows_json(rows),
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    rt.write_json(json_path, result)
    log(f"results: {json_path}")
    if md_path is not None:
        write_markdown(md_path, result, rows, workers)
        log(f"markdown: {md_path}")
    failed = [r for r in rows if not r.missing and not r.verified]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
