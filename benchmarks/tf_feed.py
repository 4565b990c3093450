#!/usr/bin/env python
"""samplecache.tf against plain tf.data over the same Parquet files: samples/s at the same batch size.

    python benchmarks/tf_feed.py [--quick] [--passes 3] [--json out.json] [--workdir DIR] [--datasets small,large]
                                 [--small N] [--large N]

Data, caches and the daemon are ``benchmarks/read_throughput.py``'s (same generators and parameters, so both
scripts and ``benchmarks/suite.py`` reuse each other's data under ``--workdir``): SMALL = 256 random uint8 +
int64 ``y`` per sample (400,000; ``--quick`` 20,000; batch 256), LARGE = 1 MiB of random float32 + ``y``
(3,000; ``--quick`` 64; batch 8). Rows, each a ``tf.data.Dataset`` of {x, y} batches of the same size, shuffled,
ending in ``.prefetch(tf.data.AUTOTUNE)``, iterated in eager mode in this process:

* ``samplecache.tf``      ``samplecache.tf.dataset(url, ["x", "y"], batch_size=B, epoch=0)`` over the
                          daemon's cache (batches gathered by the core, read ahead by its thread);
* ``tf-pyarrow-batches``  ``tf.data.Dataset.from_generator`` over pyarrow: row groups of the local Parquet
                          files in a shuffled order, rows permuted, sliced into batches of B (whole batches
                          yielded: the fast way to write it);
* ``tf-pyarrow-samples``  the same generator yielding one sample at a time, then ``.batch(B)`` (the common
                          recipe).

Every pass (one untimed warm-up, then ``--passes`` timed, the median reported) is verified against the
Parquet ground truth: sample count, sum of ``y`` and the checksum of ``x`` of ``read_throughput.Check``.
``x peer`` = samplecache.tf's samples/s over that row's; MB/s counts ``x`` (MB = 10**6 B).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up notes

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import tensorflow as tf  # noqa: E402

import peers as pe  # noqa: E402
import read_throughput as rt  # noqa: E402

LOADERS = ["samplecache.tf", "tf-pyarrow-batches", "tf-pyarrow-samples"]
PEERS = LOADERS[1:]


# --- plain tf.data over pyarrow -------------------------------------------------------------------------
class ParquetSource:
    """The local Parquet files as shuffled (file, row group) units, rows permuted: a new order each pass."""

    def __init__(self, pq_dir: Path, width: int, seed: int = 0) -> None:
        self.files = [str(f) for f in pe.parquet_files(pq_dir)]
        self.units = [(fi, rg) for fi, f in enumerate(self.files) for rg in range(pq.ParquetFile(f).num_row_groups)]
        self.width, self.seed, self.epoch = width, seed, 0

    def row_groups(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        epoch = self.epoch
        self.epoch += 1
        for k in np.random.default_rng([self.seed, epoch]).permutation(len(self.units)).tolist():
            fi, rg = self.units[k]
            table = pq.ParquetFile(self.files[fi], memory_map=True).read_row_group(rg, columns=["x", "y"])
            xs, ys = pe.arrow_xy(table, self.width)
            perm = np.random.default_rng([self.seed, epoch, k]).permutation(len(ys))
            yield xs[perm], ys[perm]

    def batches(self, b: int) -> Iterator[dict[str, np.ndarray]]:
        xs_left, ys_left = None, None
        for xs, ys in self.row_groups():
            if xs_left is not None:
                xs, ys = np.concatenate([xs_left, xs]), np.concatenate([ys_left, ys])
            whole = len(ys) // b * b
            for a in range(0, whole, b):
                yield {"x": xs[a:a + b], "y": ys[a:a + b]}
            xs_left, ys_left = (xs[whole:], ys[whole:]) if whole < len(ys) else (None, None)
        if xs_left is not None:
            yield {"x": xs_left, "y": ys_left}

    def samples(self) -> Iterator[dict[str, np.ndarray]]:
        for xs, ys in self.row_groups():
            for i in range(len(ys)):
                yield {"x": xs[i], "y": ys[i]}


def pyarrow_dataset(spec: rt.Spec, root: Path, per_sample: bool) -> tf.data.Dataset:
    src = ParquetSource(root / "parquet", spec.width)
    dtype = tf.as_dtype(np.dtype(spec.dtype))
    if per_sample:
        sig = {"x": tf.TensorSpec([spec.width], dtype), "y": tf.TensorSpec([], tf.int64)}
        ds = tf.data.Dataset.from_generator(src.samples, output_signature=sig).batch(spec.batch_size)
    else:
        sig = {"x": tf.TensorSpec([None, spec.width], dtype), "y": tf.TensorSpec([None], tf.int64)}
        ds = tf.data.Dataset.from_generator(lambda: src.batches(spec.batch_size), output_signature=sig)
    return ds.prefetch(tf.data.AUTOTUNE)


# --- measuring ----------------------------------------------------------------------------------------------
def tf_pass(ds: tf.data.Dataset, check: rt.Check) -> rt.Tally:
    n = ysum = xsum = 0
    for b in ds:
        y = b["y"].numpy()
        n += len(y)
        ysum += int(y.sum())
        xsum += check.block(b["x"].numpy())
    return rt.Tally(n, ysum, xsum)


def run_dataset(spec: rt.Spec, workdir: Path, passes: int, loaders: list[str], log: Callable[[str], None]
                ) -> list[rt.Row]:
    root = (workdir / spec.name).resolve()
    truth = {k: v for k, v in rt.generate(spec, root, log).items() if k in ("samples", "y_sum", "x_check")}
    manifest = rt.build_cache(spec, root, log)
    if manifest["samples"] != truth["samples"]:
        raise RuntimeError(f"manifest has {manifest['samples']} samples, the source {truth['samples']}")
    check = rt.Check(spec)
    rows: list[rt.Row] = []

    def row(loader: str) -> rt.Row:
        return rt.Row(loader, spec.name, 0, spec.batch_size, spec.payload, dict(truth))

    for peer in [p for p in PEERS if p in loaders]:
        log(f"{spec.name}: {peer}")
        ds = pyarrow_dataset(spec, root, per_sample=peer == "tf-pyarrow-samples")
        rows.append(rt.measure(row(peer), lambda ds=ds: tf_pass(ds, check), passes, log))
    if "samplecache.tf" in loaders:
        import samplecache.tf as sctf
        d = rt.start_daemon(spec, root)
        try:
            log(f"{spec.name}: samplecache.tf (daemon {d.url}, idle)")
            ds = sctf.dataset(d.url, ["x", "y"], batch_size=spec.batch_size, epoch=0, shuffle=True)
            rows.insert(0, rt.measure(row("samplecache.tf"), lambda: tf_pass(ds.prefetch(tf.data.AUTOTUNE), check),
                                      passes, log))
            ds.samplecache_feed.close()
        finally:
            rt.stop_daemon(d)
    return rows


# --- output -----------------------------------------------------------------------------------------------
def ratios(rows: list[rt.Row]) -> dict[tuple[str, str], float | None]:
    """(dataset, loader) -> samplecache.tf's samples/s over that row's."""
    ours = {r.dataset: r.samples_per_s for r in rows if r.loader == "samplecache.tf" and r.verified}
    return {(r.dataset, r.loader): (ours[r.dataset] / r.samples_per_s
                                    if r.dataset in ours and r.samples_per_s and r.verified else None) for r in rows}


def table(rows: list[rt.Row]) -> str:
    x = ratios(rows)
    head = f"{'dataset':<7} {'loader':<20} {'batch':>5} {'samples/s':>12} {'MB/s':>9} {'x peer':>7}  verified"
    lines = [head, "-" * len(head)]
    for r in rows:
        ok = "yes" if r.verified else ("ERROR" if r.error else "NO")
        lines.append(f"{r.dataset.upper():<7} {r.loader:<20} {r.batch_size:>5} {rt.fmt(r.samples_per_s, ',.0f'):>12} "
                     f"{rt.fmt(r.mb_per_s, ',.1f'):>9} {rt.fmt(x[(r.dataset, r.loader)], '.2f'):>7}  {ok}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="CI smoke sizes, 1 timed pass")
    p.add_argument("--small", type=int, default=None, help="SMALL samples (default 400000; --quick: 20000)")
    p.add_argument("--large", type=int, default=None, help="LARGE samples (default 3000; --quick: 64)")
    p.add_argument("--passes", type=int, default=None, help="timed passes per row (default 3; --quick: 1)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--workdir", type=Path, default=Path("bench-data"), help="data and caches (default ./bench-data)")
    p.add_argument("--datasets", default="small,large", help="comma-separated subset of small,large")
    p.add_argument("--loaders", default=",".join(LOADERS), help=f"comma-separated subset of {','.join(LOADERS)}")
    a = p.parse_args(argv)
    n_small, n_large, passes = rt.sizes(a, p)
    specs = rt.make_specs(n_small, n_large, a.quick)
    names = [s.strip() for s in a.datasets.split(",") if s.strip()]
    loaders = [s.strip() for s in a.loaders.split(",") if s.strip()]
    if not names or any(n not in specs for n in names):
        p.error(f"--datasets takes a comma-separated subset of {sorted(specs)}")
    if not loaders or any(x not in LOADERS for x in loaders):
        p.error(f"--loaders takes a comma-separated subset of {LOADERS}")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    load_start = os.getloadavg()
    a.workdir.mkdir(parents=True, exist_ok=True)
    rows: list[rt.Row] = []
    for name in names:
        rows += run_dataset(specs[name], a.workdir, passes, loaders, log)
    print(table(rows))
    print(f"\nmedian of {passes} warm pass(es) after 1 warm-up, every pass verified; MB = 1e6 B of x; "
          f"'x peer' = samplecache.tf samples/s / that row's samples/s")
    x = ratios(rows)
    result = {
        "benchmark": "tf_feed", "bench_format": rt.BENCH_FORMAT, "quick": a.quick, "passes": passes,
        "seconds": time.perf_counter() - t0, "datasets": {n: specs[n].params() for n in names},
        "host": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                 "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "numpy": np.__version__,
                 "pyarrow": pa.__version__, "tensorflow": tf.__version__},
        "rows": [{**rj, "ratio_samplecache_to_this": x[(rj["dataset"], rj["loader"])]}
                 for rj in rt.rows_json(rows)],
    }
    return rt.finish(a.json, result, rows)


if __name__ == "__main__":
    sys.exit(main())
