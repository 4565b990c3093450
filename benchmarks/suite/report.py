"""The suite's results: ratios (x limit, x best peer), issue 5's targets, the text table, the JSON rows and
the markdown page (``docs/benchmarks.md``; the sections below its ``<!-- kept: ...`` marker, written by other
benchmarks, are kept as they are).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..harness import fmt

if TYPE_CHECKING:
    from .main import SuiteRow

PEERS = ["lmdb-pickle", "parquet-arrow", "streaming", "litdata", "webdataset"]
SAMPLECACHE = ["samplecache", "samplecache-batched", "samplecache-loader", "samplecache-loader-ps"]
LOADERS = ["lmdb-limit", "lmdb-block", "lmdb-shuffled", *SAMPLECACHE, *PEERS]


def ratios(rows: list[SuiteRow]) -> dict[int, dict[str, float | None]]:
    """id(row) -> {"limit": x limit, "peer": x best peer, "best_peer": name}."""
    limit = {r.dataset: r.samples_per_s for r in rows if r.loader == "lmdb-limit" and r.verified}
    block = {r.dataset: r.samples_per_s for r in rows if r.loader == "lmdb-block" and r.verified}
    shuffled = {r.dataset: r.samples_per_s for r in rows if r.loader == "lmdb-shuffled" and r.verified}
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
        blk, shu = block.get(r.dataset), shuffled.get(r.dataset)
        out[id(r)] = {"limit": rate / lim if (rate and lim) else None, "block": rate / blk if (rate and blk) else None,
                      "shuffled": rate / shu if (rate and shu) else None,
                      "peer": rate / b.samples_per_s if (rate and b is not None and b.samples_per_s) else None,
                      "best_peer": b.loader if b is not None else None}
    return out


# issues 5 and 26's targets: (what, dataset, workers, samplecache rows (the best of them counts), against, minimum)
TARGETS = [
    ("LARGE w=0: samplecache vs the limit", "large", 0, SAMPLECACHE, "limit", 0.9),
    ("LARGE w=0: samplecache vs the best peer", "large", 0, SAMPLECACHE, "peer", 3.0),
    ("LARGE w=2: samplecache vs the best peer", "large", 2, SAMPLECACHE, "peer", 3.0),
    ("SMALL w=0: batched vs the best peer", "small", 0, ["samplecache-batched", "samplecache-loader"], "peer", 5.0),
    ("SMALL w=2: batched vs the best peer", "small", 2, ["samplecache-batched", "samplecache-loader"], "peer", 5.0),
    ("SMALL w=0: per-sample vs the best peer", "small", 0, ["samplecache", "samplecache-loader-ps"], "peer", 1.5),
    ("SMALL w=2: per-sample vs the best peer", "small", 2, ["samplecache", "samplecache-loader-ps"], "peer", 1.5),
    # issue 26: small batches in-process against the raw block scan (a whole block's x copied at once)
    ("SMALL w=0: in-process vs the block scan", "small", 0, ["samplecache-batched", "samplecache-loader"], "block",
     0.25),
    # no target, the context of the one above: the same memory access as a shuffled epoch, the gathers alone
    ("SMALL w=0: in-process vs the shuffled gather", "small", 0, ["samplecache-batched", "samplecache-loader"],
     "shuffled", None),
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
                    "against": {"limit": "lmdb-limit", "block": "lmdb-block", "shuffled": "lmdb-shuffled"}.get(
                        against, best), "ratio": got, "minimum": minimum,
                    "met": None if got is None or minimum is None else got >= minimum})
    return out


def targets_text(ts: list[dict[str, Any]], markdown: bool) -> str:
    lines = (["| target | samplecache row | against | ratio | needed | met |", "|---|---|---|---:|---:|---|"]
             if markdown else [f"{'target':<45} {'row':<20} {'against':<14} {'ratio':>6} {'needed':>6}  met"])
    for t in ts:
        met = "-" if t["met"] is None else ("yes" if t["met"] else "NO")
        cells = [t["target"], t["loader"] or "-", t["against"] or "-", fmt(t["ratio"], ".2f"),
                 "-" if t["minimum"] is None else f"{t['minimum']:.2f}", met]
        if markdown:
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(f"{cells[0]:<45} {cells[1]:<20} {cells[2]:<14} {cells[3]:>6} {cells[4]:>6}  {cells[5]}")
    return "\n".join(lines)


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


KEPT = "<!-- kept: sections below are written by other benchmarks (python -m benchmarks.suite keeps them) -->"
KEPT_PREFIX = "<!-- kept:"  # any wording of the marker


def missing_text(missing: list[dict[str, Any]]) -> str:
    """The run's missing peers as a list item (empty when none)."""
    if not missing:
        return ""
    items = "; ".join(f"{m['name']} (`{m['install']}`)" for m in missing)
    return f"\n* not installed here, their rows say so: {items}"


def write_markdown(path: Path, result: dict[str, Any], rows: list[SuiteRow], workers: list[int]) -> None:
    m, ds = result["machine"], result["datasets"]
    v = m.get("versions", {})
    sizes = ", ".join(f"{n.upper()} = {d['samples']:,} samples x {d['width'] * np.dtype(d['dtype']).itemsize:,} B "
                      f"(batch {d['batch_size']})" for n, d in ds.items())
    # made apart: inline, their template lines would pass the line limit
    python_torch_numpy = f"python {m.get('python')}, torch {v.get('torch')}, numpy {v.get('numpy')}"
    quick = " (QUICK sizes: not representative)" if result["quick"] else ""
    text = f"""# Benchmarks: samplecache against its peers

<!-- written by `python -m benchmarks.suite` (the results below are replaced on every full run) -->

One command, from the repository root, generates the data, converts it to every peer's format, runs
every loader and writes this page and a JSON file:

```
bash benchmarks/install_peers.sh              # optional peers, without touching the pinned torch
.venv/bin/python -m benchmarks.suite          # full size: about 20-40 minutes on 2 cores
.venv/bin/python -m benchmarks.suite --quick  # CI smoke sizes (< 3 minutes), every row still verified
```

Method (details in the docstrings of `benchmarks/suite/main.py`, `benchmarks/suite/peers.py` and `benchmarks/harness/`):

* Code: every benchmark is a short `main` over one shared harness, `benchmarks/harness/` (data
  generation and ground truth, the daemon's start and stop, the S3 server of the tests, verified
  passes, flags, host facts, the JSON report and exit code); the benchmarks are a package run as
  `python -m benchmarks.<name>`. A peer or tool that is not installed is reported as "not installed"
  with the command that installs it, and every other row still runs.

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
  suite imports only `streaming.base.dataset` and the MDS writer (see `benchmarks/suite/peers.py`), so
  neither is needed.
* The machine is shared (2 cores; other work may run at the same time): every figure is a wall-clock
  rate and moves with the load average given below.

## Latest run

* date: {result['date']}
* machine: {m.get('cpu', '?')}, {m.get('cores')} cores, {m.get('ram_gib', '?')} GiB RAM; {m.get('platform')}
* samplecache: git {m.get('git') or '?'} (`+dirty`: uncommitted changes under client/ or service/)
* {python_torch_numpy}, pyarrow {v.get('pyarrow')}, lmdb {v.get('lmdb')};
  mosaicml-streaming {v.get('mosaicml-streaming') or 'not installed'}, litdata {v.get('litdata') or 'not installed'},
  webdataset {v.get('webdataset') or 'not installed'}
* load average (1, 5, 15 min) at start {result['loadavg_start']}, at end {result['loadavg_end']}
* data: {sizes}; {result['passes']} timed pass(es) per row{quick}
* suite time: {result['seconds']:.0f} s{missing_text(result.get('missing') or [])}

{pivot(rows, workers)}

Issue 5's targets, as measured in this run (the best samplecache row of each group; ratios of samples/s):

{targets_text(result["targets"], markdown=True)}

All rows:

{markdown_table(rows)}
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.exists() else ""
    at = old.find(KEPT_PREFIX)  # sections written by other benchmarks (tf_feed, feed) stay as they are
    kept = old[at:] if at >= 0 else KEPT + "\n"
    text += "\n" + KEPT + kept[kept.index("-->") + 3:]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


