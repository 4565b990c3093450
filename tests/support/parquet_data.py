"""Deterministic Parquet test data (pyarrow + numpy): typed edge cases, a learnable task, raw benchmark rows."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Characters for `text`: ASCII, Latin-1, Greek, CJK, emoji (4-byte UTF-8) and a combining mark.
_ALPHABET = list("abcXYZ 09_-éßøΩλж中文字🙂🚀\u0301")
TENSOR_SHAPE = (4, 3)
VEC_LEN = 5
CONST_LIST_LEN = 8


def _fsl(values: np.ndarray, size: int) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values), size)


def _list(values: np.ndarray, lengths: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type))


def _nested(rng: np.random.Generator, n: int) -> pa.ListArray:
    """list<list<float64>>, each row rectangular: outer 0..3 rows of inner 1..4 values (rows 0-2: 2x3, 1x1, 0)."""
    outer = rng.integers(0, 4, n)
    inner = rng.integers(1, 5, n)
    for i, (o, k) in enumerate([(2, 3), (1, 1), (0, 1)][:n]):
        outer[i], inner[i] = o, k
    inner_lengths = np.repeat(inner, outer)
    values = rng.standard_normal(int(inner_lengths.sum()))
    inner_arr = _list(values, inner_lengths, pa.float64())
    offsets = np.concatenate([[0], np.cumsum(outer)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), inner_arr)


def make_typed_table(n_rows: int, seed: int, id_offset: int = 0) -> pa.Table:
    """Every supported column type; ``id`` is ``id_offset .. id_offset + n_rows - 1``."""
    rng = np.random.default_rng(seed)
    n = n_rows
    text_len = rng.integers(0, 13, n)
    text_len[3::11] = 0  # guaranteed empty strings
    chars = rng.integers(0, len(_ALPHABET), int(text_len.sum()))
    starts = np.concatenate([[0], np.cumsum(text_len)])
    text = ["".join(_ALPHABET[c] for c in chars[starts[i]:starts[i + 1]]) for i in range(n)]
    blob_len = rng.integers(0, 41, n)
    blob_len[5::13] = 0
    blob_bytes = rng.bytes(int(blob_len.sum()))
    blob_ends = np.cumsum(blob_len)
    blob = [blob_bytes[e - k:e] for e, k in zip(blob_ends.tolist(), blob_len.tolist())]
    null = rng.random(n) < 0.2
    null[1::7] = True
    maybe = [None if null[i] else f"m{id_offset + i}·{text[i]}" for i in range(n)]
    var_len = rng.integers(0, 7, n)
    tensor_inner = _fsl(rng.standard_normal(n * 12).astype(np.float32), TENSOR_SHAPE[1])
    return pa.table({
        "id": pa.array(np.arange(id_offset, id_offset + n, dtype=np.int64)),
        "i8": pa.array(rng.integers(-128, 128, n, dtype=np.int8)),
        "u16": pa.array(rng.integers(0, 1 << 16, n, dtype=np.uint16)),
        "i32": pa.array(rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int32)),
        "f16": pa.array(rng.standard_normal(n).astype(np.float16)),
        "f32": pa.array(rng.standard_normal(n).astype(np.float32)),
        "f64": pa.array(rng.standard_normal(n)),
        "flag": pa.array(rng.random(n) < 0.5),
        "tensor": pa.FixedSizeListArray.from_arrays(tensor_inner, TENSOR_SHAPE[0]),
        "vec": _fsl(rng.integers(-(1 << 15), 1 << 15, n * VEC_LEN, dtype=np.int16), VEC_LEN),
        "const_list": _list(rng.standard_normal(n * CONST_LIST_LEN).astype(np.float32),
                            np.full(n, CONST_LIST_LEN), pa.float32()),
        "var_list": _list(rng.integers(-1000, 1000, int(var_len.sum()), dtype=np.int32), var_len, pa.int32()),
        "nested": _nested(rng, n),
        "text": pa.array(text, type=pa.utf8()),
        "blob": pa.array(blob, type=pa.binary()),
        "maybe_text": pa.array(maybe, type=pa.utf8()),
    })


TableMaker = Callable[[int, int, int], pa.Table]  # (n_rows, seed, id_offset) -> table


def write_dataset(fs_or_path: Any, prefix: str, n_files: int, rows_per_file: int, row_group_size: int,
                  seed: int = 0, make: TableMaker = make_typed_table, compression: str = "snappy") -> pa.Table:
    """Write ``prefix/part-00000.parquet`` ... and return the concatenated ground truth.

    ``fs_or_path`` is a local directory (str/PathLike; ``prefix`` may be "") or an fsspec filesystem such as
    s3fs, with ``prefix`` = "bucket/some/prefix". File i holds ids ``i*rows_per_file ...`` and uses seed+i."""
    tables = []
    for i in range(n_files):
        t = make(rows_per_file, seed + i, i * rows_per_file)
        name = f"part-{i:05d}.parquet"
        if isinstance(fs_or_path, (str, os.PathLike)):
            d = Path(fs_or_path) / prefix
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, d / name, row_group_size=row_group_size, compression=compression)
        else:
            with fs_or_path.open(f"{prefix.rstrip('/')}/{name}", "wb") as f:
                pq.write_table(t, f, row_group_size=row_group_size, compression=compression)
        tables.append(t)
    return pa.concat_tables(tables)


def make_learnable_table(n_rows: int, n_features: int = 16, n_classes: int = 4, seed: int = 0,
                         centers_seed: int = 12345) -> pa.Table:
    """Gaussian clusters (unit noise around centers ~ N(0, 1.5^2)): ``features`` fixed_size_list<float32,F>,
    ``label`` int64. The centers depend only on ``centers_seed``, so files made with different seeds share
    one task. A nearest-centroid or small MLP classifier exceeds 90% accuracy."""
    centers = np.random.default_rng(centers_seed).normal(0.0, 1.5, (n_classes, n_features))
    rng = np.random.default_rng(seed)
    label = rng.integers(0, n_classes, n_rows, dtype=np.int64)
    x = (centers[label] + rng.standard_normal((n_rows, n_features))).astype(np.float32)
    return pa.table({"features": _fsl(x.reshape(-1), n_features), "label": pa.array(label)})


def make_raw_table(n_rows: int, sample_bytes: int, dtype: Any = np.uint8, seed: int = 0,
                   n_classes: int = 10) -> pa.Table:
    """Benchmark rows: ``x`` fixed_size_list<dtype, sample_bytes / itemsize> of random (incompressible) data,
    ``y`` int64 labels. Integer dtypes get uniform random bits; floats get standard normals (no NaN/inf)."""
    dt = np.dtype(dtype)
    if sample_bytes % dt.itemsize:
        raise ValueError(f"sample_bytes={sample_bytes} is not a multiple of {dt} itemsize {dt.itemsize}")
    rng = np.random.default_rng(seed)
    count = n_rows * (sample_bytes // dt.itemsize)
    if dt.kind == "f":
        x = rng.standard_normal(count, dtype=np.float32 if dt.itemsize <= 4 else np.float64).astype(dt)
    else:
        x = np.frombuffer(rng.bytes(count * dt.itemsize), dtype=dt)
    return pa.table({"x": _fsl(x, sample_bytes // dt.itemsize),
                     "y": pa.array(rng.integers(0, n_classes, n_rows, dtype=np.int64))})
