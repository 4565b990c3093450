"""A real S3 server on loopback for a benchmark (``samplecache_tools.s3server``, as in the tests) and its clients.

    with s3_server(root / "s3") as s3:       # SeaweedFS (weed mini); its data removed afterwards
        fs = s3.fs()                         # an s3fs filesystem on it
        s3.make_bucket("bench")
        truth = upload(spec, fs, "bench/large")
        d = start_daemon("s3://bench/large/", cache, env=s3.env())

``s3_server`` raises ``needs.Missing`` (which and how to install) when s3fs or the ``weed`` binary is not
installed.
``s3fs_options(s3)`` are the keyword arguments of an ``s3fs.S3FileSystem`` on it in another process
(no instance or listings cache). ``row_group_ranges`` is every row group's byte range of the files under a
prefix (their column chunks are contiguous: one range per row group).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow.parquet as pq

from .data import Log, Spec, write_parquet
from .needs import require

if TYPE_CHECKING:
    from samplecache_tools.s3server import S3Server


@contextmanager
def s3_server(root: Path, backend: str = "seaweedfs", keep: bool = False) -> Iterator["S3Server"]:
    """A started S3 server with its data in a fresh directory under ``root``; stopped (and the data removed
    unless ``keep``) at the end."""
    require("s3fs")
    if backend == "seaweedfs":
        require("seaweedfs")
    from samplecache_tools.s3server import S3Server

    root.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="s3-", dir=root))
    try:
        with S3Server(data, backend) as s3:
            yield s3
    finally:
        if not keep:
            shutil.rmtree(data, ignore_errors=True)


def s3fs_options(s3: "S3Server") -> dict[str, Any]:
    """``s3fs.S3FileSystem(**options)`` on ``s3`` (picklable: for reader processes)."""
    return dict(key=s3.key, secret=s3.secret, client_kwargs={"endpoint_url": s3.endpoint},
                skip_instance_cache=True, use_listings_cache=False)


def upload(spec: Spec, fs: Any, prefix: str, log: Log) -> dict[str, Any]:
    """``spec``'s Parquet files written to ``fs`` under ``prefix`` (``bucket/dir``); the truth of
    ``data.write_parquet`` plus ``url`` (``s3://prefix``) and ``upload_s``."""
    t0 = time.perf_counter()
    truth: dict[str, Any] = write_parquet(spec, lambda name: fs.open(f"{prefix}/{name}", "wb"))
    truth.update(url=f"s3://{prefix}", upload_s=time.perf_counter() - t0)
    log(f"{spec.name}: uploaded {spec.samples:,} samples in {truth['files']} files to s3://{prefix} "
        f"in {truth['upload_s']:.1f}s")
    return truth


def row_group_ranges(fs: Any, prefix: str) -> tuple[list[tuple[str, int, int, int]], int]:
    """``([(path, start, length, row group), ...], total file bytes)`` of every Parquet file under ``prefix``:
    each row group's column chunks as one byte range."""
    ranges, file_bytes = [], 0
    for path in sorted(fs.find(prefix)):
        with fs.open(path, "rb", block_size=1 << 20) as f:
            md = pq.ParquetFile(f).metadata
            file_bytes += f.size
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            starts = []
            for j in range(rg.num_columns):
                cc = rg.column(j)
                first = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
                starts.append((first, first + cc.total_compressed_size))
            lo, hi = min(s for s, _ in starts), max(e for _, e in starts)
            ranges.append((path, lo, hi - lo, i))
    return ranges, file_bytes
