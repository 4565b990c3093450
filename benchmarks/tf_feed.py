"""samplecache.tf against plain tf.data over the same Parquet files: samples/s at the same batch size.

    python -m benchmarks.tf_feed [--quick] [--passes 3] [--json out.json] [--workdir DIR] [--datasets small,large]
                                 [--small N] [--large N]

Data, caches and the daemon are the harness's (``benchmarks.harness``: the generators and parameters of
read_throughput and suite, which reuse each other's data under ``--workdir``): SMALL = 256 random uint8 +
int64 ``y`` per sample (400,000; ``--quick`` 20,000; batch 256), LARGE = 1 MiB of random float32 + ``y``
(3,000; ``--quick`` 64; batch 8). Rows, each a ``tf.data.Dataset`` of {x, y} batches of the same size, shuffled,
ending in ``.prefetch(tf.data.AUTOTUNE)``, iterated in eager mode in this process:

* ``samplecache.tf``      ``samplecache.tf.dataset(url, ["x", "y"], batch_size=B, epoch=0)`` over the
                          daemon's cache (batches gathered by the core, read ahead by its thread);
* ``tf-pyarrow-batches``  ``tf.data.Dataset.from_generator`` over pyarrow: row groups of the local Parquet
                          files in a shuffled order, rows permuted, sliced into batches of B (whole batches
                          yielded: the fast way to write it);
* ``tf-pyarrow-samples``  the same generator yielding one sample at a time, then ``.batch(B)`` (the common
                          recipe);
* ``tf-in-memory``        informational, TensorFlow's own floor: the whole dataset already in memory, rows
                          permuted once, ``from_tensor_slices(...).batch(B)``: nothing is read, only sliced,
                          batched and handed over by the eager iterator (datasets up to 1 GiB).

Every pass (one untimed warm-up, then ``--passes`` timed, the median reported) is verified against the
Parquet ground truth: sample count, sum of ``y`` and the checksum of ``x`` of ``harness.Check``.
``x peer`` = samplecache.tf's samples/s over that row's; MB/s counts ``x`` (MB = 10**6 B). Without
TensorFlow every row is reported "not installed" with the command that installs it (exit code 0).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow.parquet as pq

from .harness import (
    BENCH_FORMAT,
    Check,
    Row,
    Spec,
    Tally,
    arrow_xy,
    build_cache,
    cli,
    fmt,
    generate,
    make_specs,
    measure,
    missing,
    missing_report,
    parquet_files,
    print_missing,
    report,
    serve,
    stop_daemon,
    text_table,
)
from .harness.cli import log

LOADERS = ["samplecache.tf", "tf-in-memory", "tf-pyarrow-batches", "tf-pyarrow-samples"]
PEERS = LOADERS[2:]
IN_MEMORY_MAX = 1 << 30  # tf-in-memory holds the dataset twice (numpy and TensorFlow): run up to this size


# --- plain tf.data over pyarrow -------------------------------------------------------------------------
class ParquetSource:
    """The local Parquet files as shuffled (file, row group) units, rows permuted: a new order each pass."""

    def __init__(self, pq_dir: Path, width: int, seed: int = 0) -> None:
        self.files = [str(f) for f in parquet_files(pq_dir)]
        self.units = [(fi, rg) for fi, f in enumerate(self.files) for rg in range(pq.ParquetFile(f).num_row_groups)]
        self.width, self.seed, self.epoch = width, seed, 0

    def row_groups(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        epoch = self.epoch
        self.epoch += 1
        for k in np.random.default_rng([self.seed, epoch]).permutation(len(self.units)).tolist():
            fi, rg = self.units[k]
            table = pq.ParquetFile(self.files[fi], memory_map=True).read_row_group(rg, columns=["x", "y"])
            xs, ys = arrow_xy(table, self.width)
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


def pyarrow_dataset(spec: Spec, root: Path, per_sample: bool) -> Any:
    import tensorflow as tf

    src = ParquetSource(root / "parquet", spec.width)
    dtype = tf.as_dtype(np.dtype(spec.dtype))
    if per_sample:
        sig = {"x": tf.TensorSpec([spec.width], dtype), "y": tf.TensorSpec([], tf.int64)}
        ds = tf.data.Dataset.from_generator(src.samples, output_signature=sig).batch(spec.batch_size)
    else:
        sig = {"x": tf.TensorSpec([None, spec.width], dtype), "y": tf.TensorSpec([None], tf.int64)}
        ds = tf.data.Dataset.from_generator(lambda: src.batches(spec.batch_size), output_signature=sig)
    return ds.prefetch(tf.data.AUTOTUNE)


def in_memory_dataset(spec: Spec, root: Path) -> Any:
    import tensorflow as tf

    parts = list(ParquetSource(root / "parquet", spec.width).row_groups())
    xs, ys = np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
    perm = np.random.default_rng(0).permutation(len(ys))
    return tf.data.Dataset.from_tensor_slices({"x": xs[perm], "y": ys[perm]}).batch(spec.batch_size) \
        .prefetch(tf.data.AUTOTUNE)


# --- measuring ----------------------------------------------------------------------------------------------
def tf_pass(ds: Any, check: Check) -> Tally:
    n = ysum = xsum = 0
    for b in ds:
        y = b["y"].numpy()
        n += len(y)
        ysum += int(y.sum())
        xsum += check.block(b["x"].numpy())
    return Tally(n, ysum, xsum)


def run_dataset(spec: Spec, workdir: Path, passes: int, loaders: list[str], no_tf: str | None) -> list[Row]:
    root = (workdir / spec.name).resolve()
    truth = generate(spec, root, log)
    manifest = build_cache(spec, root, log)
    check = Check(spec)
    rows: list[Row] = []

    def row(loader: str) -> Row:
        return Row(loader, spec.name, 0, spec.batch_size, spec.payload, dict(truth), missing=no_tf)

    if no_tf is not None:  # every row needs TensorFlow: reported, with the install command
        return [row(name) for name in LOADERS if name in loaders]
    import tensorflow as tf

    if "tf-in-memory" in loaders and spec.samples * spec.payload > IN_MEMORY_MAX:
        log(f"{spec.name}: tf-in-memory left out: {spec.samples * spec.payload / 2**30:.1f} GiB is over its 1 GiB")
    elif "tf-in-memory" in loaders:
        log(f"{spec.name}: tf-in-memory")
        ds = in_memory_dataset(spec, root)
        r = row("tf-in-memory")
        r.info = True
        rows.append(measure(r, lambda ds=ds: tf_pass(ds, check), passes, log))
    for peer in [p for p in PEERS if p in loaders]:
        log(f"{spec.name}: {peer}")
        ds = pyarrow_dataset(spec, root, per_sample=peer == "tf-pyarrow-samples")
        rows.append(measure(row(peer), lambda ds=ds: tf_pass(ds, check), passes, log))
    if "samplecache.tf" in loaders:
        import samplecache.tf as sctf
        d = serve(spec, root, manifest)
        try:
            log(f"{spec.name}: samplecache.tf (daemon {d.url}, idle)")
            ds = sctf.dataset(d.url, ["x", "y"], batch_size=spec.batch_size, epoch=0, shuffle=True)
            rows.insert(0, measure(row("samplecache.tf"), lambda: tf_pass(ds.prefetch(tf.data.AUTOTUNE), check),
                                   passes, log))
            ds.samplecache_feed.close()
        finally:
            stop_daemon(d)
    return rows


# --- output -----------------------------------------------------------------------------------------------
def ratios(rows: list[Row]) -> dict[int, float | None]:
    """Row index -> samplecache.tf's samples/s over that row's."""
    ours = {r.dataset: r.samples_per_s for r in rows if r.loader == "samplecache.tf" and r.verified}
    return {i: (ours[r.dataset] / r.samples_per_s if r.dataset in ours and r.samples_per_s and r.verified else None)
            for i, r in enumerate(rows)}


def table(rows: list[Row]) -> str:
    x = ratios(rows)
    head = [("dataset", -7), ("loader", -20), ("batch", 5), ("samples/s", 12), ("MB/s", 9), ("x peer", 7),
            (" verified", -9)]
    return text_table(head, [[(r.dataset.upper(), -7), (r.loader, -20), (str(r.batch_size), 5),
                              (fmt(r.samples_per_s, ',.0f'), 12), (fmt(r.mb_per_s, ',.1f'), 9),
                              (fmt(x[i], '.2f'), 7), (" " + r.status, -9)] for i, r in enumerate(rows)])


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    cli.common(p, quick="CI smoke sizes, 1 timed pass")
    cli.loader_sizes(p)
    p.add_argument("--datasets", default="small,large", help="comma-separated subset of small,large")
    p.add_argument("--loaders", default=",".join(LOADERS), help=f"comma-separated subset of {','.join(LOADERS)}")
    a = p.parse_args(argv)
    n_small, n_large, passes = cli.sizes(a, p)
    specs = make_specs(n_small, n_large, a.quick)
    names = cli.subset(p, "--datasets", a.datasets, list(specs))
    loaders = cli.subset(p, "--loaders", a.loaders, LOADERS)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up notes
    no_tf = missing("tensorflow")
    gone = {"tensorflow": no_tf} if no_tf else {}
    t0, load_start = time.perf_counter(), report.loadavg()
    a.workdir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for name in names:
        rows += run_dataset(specs[name], a.workdir, passes, loaders, no_tf)
    print(table(rows))
    print(f"\nmedian of {passes} warm pass(es) after 1 warm-up, every pass verified; MB = 1e6 B of x; "
          f"'x peer' = samplecache.tf samples/s / that row's samples/s")
    print_missing(gone)
    result = {
        "benchmark": "tf_feed", "bench_format": BENCH_FORMAT, "quick": a.quick, "passes": passes,
        "seconds": time.perf_counter() - t0, "datasets": {n: specs[n].params() for n in names},
        "host": report.host(load_start, ("numpy", "pyarrow", "tensorflow-cpu", "tensorflow")),
        "missing": missing_report(gone),
        "rows": report.rows_json(rows, ratios(rows), "ratio_samplecache_to_this"),
    }
    return report.finish(a.json, result, rows)


if __name__ == "__main__":
    raise SystemExit(main())
