"""The generated datasets: random, incompressible Parquet (written uncompressed) and its ground truth.

A ``Spec`` names one dataset: ``samples`` rows of ``x`` = fixed_size_list<dtype, width> and an int64 label
``y``, ``row_group`` rows per row group, ``rows_per_file`` rows per file, drawn from ``seed``. The two
datasets the loader benchmarks share (``make_specs``):

* SMALL: ``x`` = 256 random uint8 (256 B), batch 256;
* LARGE: ``x`` = 262,144 random float32 (1 MiB), batch 8.

``write_parquet(spec, open_file)`` writes the files through any opener (a local directory, an S3 bucket
through s3fs) and returns the truth: ``{"samples", "y_sum", "x_check", "files"}``. ``x_check`` is
``Check(spec)``'s checksum over every sample: bytes 0 and 255 for uint8, every ``LARGE_STRIDE``-th float32
(as int32 bits) otherwise. ``generate(spec, root, log)`` keeps a local copy under ``root/parquet`` and reuses
it while ``spec.params()`` (which includes ``BENCH_FORMAT`` and the record format) is unchanged.
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from samplecache.format.record import FORMAT_VERSION

BENCH_FORMAT = 1           # bump when the generated data or the build procedure changes
LARGE_STRIDE = 4096        # the float32 checksum: every 4096th item of x, as int32 bits
MB = 1e6                   # every MB in the benchmarks is 10**6 bytes

Log = Callable[[str], None]


@dataclass(frozen=True)
class Spec:
    name: str              # "small" | "large" (or the benchmark's own)
    samples: int
    row_group: int         # rows per row group
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
        """What the data depends on: a reused copy must match it exactly."""
        return {"bench_format": BENCH_FORMAT, "record_format": FORMAT_VERSION, **asdict(self)}

    def arrow_schema(self) -> pa.Schema:
        item = pa.from_numpy_dtype(np.dtype(self.dtype))
        return pa.schema([("x", pa.list_(item, self.width)), ("y", pa.int64())])


def make_specs(n_small: int, n_large: int, quick: bool) -> dict[str, Spec]:
    """SMALL and LARGE, the datasets of read_throughput, suite, feed and tf_feed (same parameters, so the
    same data and caches under one ``--workdir``). ``quick``: smaller row groups, so that every dataset
    still has several shards (DataLoader workers split by shard)."""
    srg, lrg = (5_000, 16) if quick else (50_000, 64)
    return {
        "small": Spec("small", n_small, srg, "uint8", 256, 256, seed=1, rows_per_file=srg * 4),
        "large": Spec("large", n_large, lrg, "float32", 262_144, 8, seed=2, rows_per_file=lrg * 8),
    }


class Check:
    """The checksum of x: one definition per sample (numpy), per block (numpy) and per batch (torch)."""

    def __init__(self, spec: Spec) -> None:
        self.small = spec.dtype == "uint8"
        self.last = spec.width - 1

    def sample(self, x: np.ndarray) -> int:
        if self.small:
            return x.item(0) + x.item(self.last)  # type: ignore[no-any-return]
        return int(x.view(np.int32)[::LARGE_STRIDE].sum(dtype=np.int64))

    def block(self, xs: np.ndarray) -> int:
        """xs: (rows, width)."""
        if self.small:
            return int(xs[:, 0].sum(dtype=np.int64)) + int(xs[:, self.last].sum(dtype=np.int64))
        return int(xs.view(np.int32)[:, ::LARGE_STRIDE].sum(dtype=np.int64))

    def batch(self, x: Any) -> int:
        """x: a torch tensor (batch, width), as default_collate makes it."""
        import torch
        if self.small:
            return int(x[:, 0].sum(dtype=torch.int64)) + int(x[:, self.last].sum(dtype=torch.int64))
        return int(x.view(torch.int32)[:, ::LARGE_STRIDE].sum(dtype=torch.int64))


def random_block(spec: Spec, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(x flat (n * width,), y (n,)) of ``n`` random rows: uniform bytes, or float32 in [0, 1) (random
    mantissas: practically incompressible)."""
    flat: np.ndarray
    if spec.dtype == "uint8":
        flat = rng.integers(0, 256, size=n * spec.width, dtype=np.uint8)
    else:
        flat = rng.random(n * spec.width, dtype=np.float32)
    return flat, rng.integers(0, 1 << 31, size=n, dtype=np.int64)


def write_parquet(spec: Spec, open_file: Callable[[str], AbstractContextManager[IO[bytes]]]) -> dict[str, int]:
    """Write ``spec``'s files ``part-00000.parquet``, ... through ``open_file(name)`` (a writable binary file
    as a context manager: ``lambda n: open(d / n, "wb")``, ``lambda n: fs.open(f"{bucket}/{n}", "wb")``).
    Returns the truth ``{"samples", "y_sum", "x_check", "files"}``."""
    rng = np.random.default_rng(spec.seed)
    schema = spec.arrow_schema()
    item = schema.field("x").type.value_type
    check = Check(spec)
    y_sum = x_check = done = files = 0
    while done < spec.samples:
        rows_in_file = min(spec.rows_per_file, spec.samples - done)
        with open_file(f"part-{files:05d}.parquet") as f, \
                pq.ParquetWriter(f, schema, compression="none", use_dictionary=False, write_statistics=False) as w:
            start = 0
            while start < rows_in_file:
                n = min(spec.row_group, rows_in_file - start)
                flat, y = random_block(spec, rng, n)
                x = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=item), spec.width)
                w.write_table(pa.Table.from_arrays([x, pa.array(y)], schema=schema), row_group_size=n)
                y_sum += int(y.sum())
                x_check += check.block(flat.reshape(n, spec.width))
                start += n
        done += rows_in_file
        files += 1
    return {"samples": spec.samples, "y_sum": y_sum, "x_check": x_check, "files": files}


def parquet_files(pq_dir: Path) -> list[Path]:
    """The generated Parquet files of a dataset, in file order."""
    return sorted(pq_dir.glob("*.parquet"))


def arrow_xy(table: pa.Table, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(x (n, width), y (n,)) of a table read back from those files, x without a copy where Arrow allows it."""
    x = table.column("x").combine_chunks()
    flat = x.values.to_numpy(zero_copy_only=True) if x.offset == 0 else x.flatten().to_numpy()
    return flat.reshape(len(x), width), table.column("y").to_numpy()


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as JSON in ``path``, atomically (a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    tmp.replace(path)


def truth_of(t: dict[str, int]) -> dict[str, int]:
    """The three figures every pass is verified against: samples, y_sum, x_check."""
    return {k: t[k] for k in ("samples", "y_sum", "x_check")}


def generate(spec: Spec, root: Path, log: Log) -> dict[str, int]:
    """``spec``'s Parquet files under ``root/parquet`` (reused while the parameters match); their truth."""
    params_path, truth_path, pq_dir = root / "params.json", root / "truth.json", root / "parquet"
    truth = read_json(truth_path)
    if read_json(params_path) == spec.params() and truth is not None and pq_dir.is_dir():
        log(f"{spec.name}: reusing {pq_dir}")
        return truth_of(truth)
    if root.exists():
        shutil.rmtree(root)
    pq_dir.mkdir(parents=True)
    log(f"{spec.name}: generating {spec.samples:,} samples x {spec.payload:,} B in {pq_dir}")
    t0 = time.perf_counter()
    truth = truth_of(write_parquet(spec, lambda name: open(pq_dir / name, "wb")))
    write_json(truth_path, truth)
    write_json(params_path, spec.params())
    log(f"{spec.name}: generated in {time.perf_counter() - t0:.1f}s")
    return truth
