"""The two datasets of benchmarks/ingest/main.py (``harness.Spec``, written by ``harness.upload`` to the S3 server)
and their truth: sample count, sum of ``y``, every row group's byte range, the bytes of the column chunks
(what a sampler must fetch at least) and of the footers.

* LARGE: ``x`` = fixed_size_list<float32, 262144> (1 MiB) + int64 ``y``, 16 rows (16.8 MB) per row group;
* SMALL: ``x`` = fixed_size_list<uint8, 256> + int64 ``y``, 10,000 rows (10.4 MB) per row group (Parquet has no
  8-bit type: each uint8 is stored as an INT32, so a 256-byte row takes about 1,037 bytes in the file);

4 row groups per file, random (incompressible), written uncompressed; the sizes asked for are Parquet bytes.
``--quick``: 4 and 2,000 rows per row group.
"""

from __future__ import annotations

from typing import Any

from ..harness import MB, Spec, log, row_group_ranges, upload

BUCKET = "samplecache-bench"


def make_specs(large_mb: float, small_mb: float, quick: bool) -> dict[str, Spec]:
    lrg, srg = (4, 2_000) if quick else (16, 10_000)
    nl = max(lrg, int(large_mb * MB / (4 * 262_144 + 8)) // lrg * lrg)  # float32 and uint8 items: 4 bytes each
    ns = max(srg, int(small_mb * MB / (4 * 256 + 8)) // srg * srg)
    return {"large": Spec("large", nl, lrg, "float32", 262_144, 8, seed=11, rows_per_file=4 * lrg),
            "small": Spec("small", ns, srg, "uint8", 256, 256, seed=12, rows_per_file=4 * srg)}


def upload_truth(spec: Spec, fs: Any) -> dict[str, Any]:
    """``spec`` uploaded under ``BUCKET/<name>``; its truth with ``ranges`` ((path, start, length, row group)),
    ``row_group_bytes`` (the column chunks: they are contiguous, so also the bytes a unit needs) and
    ``footer_bytes`` (the rest of the files but the 4-byte magic at the start)."""
    prefix = f"{BUCKET}/{spec.name}"
    truth = upload(spec, fs, prefix, log)
    ranges, file_bytes = row_group_ranges(fs, prefix)
    needed = sum(r[2] for r in ranges)
    truth.update(ranges=ranges, row_groups=len(ranges), row_group_bytes=needed, needed_bytes=needed,
                 file_bytes=file_bytes, footer_bytes=file_bytes - needed - 4 * truth["files"])
    log(f"{spec.name}: {len(ranges)} row groups, {needed / MB:,.1f} MB of column chunks")
    return truth


def part_truth(truth: dict[str, Any], fs: Any) -> dict[str, Any] | None:
    """The first half of the files (at least one, fewer than all) as a source of its own, with its truth (the
    sum of ``y`` read back from the files); None when there is one file only."""
    paths = sorted({r[0] for r in truth["ranges"]})
    k = len(paths) // 2
    if k < 1:
        return None
    import pyarrow.parquet as pq

    part = set(paths[:k])
    ranges = [r for r in truth["ranges"] if r[0] in part]
    y_sum = samples = 0
    for path in paths[:k]:
        with fs.open(path, "rb") as f:
            y = pq.read_table(f, columns=["y"]).column("y")
        y_sum += int(y.to_numpy().sum())
        samples += len(y)
    stem = paths[0].rsplit("/", 1)
    # one file is a source by itself; several, a glob of the first k part numbers (part-00000 ... part-0000k-1)
    source = f"s3://{paths[0]}" if k == 1 else f"s3://{stem[0]}/part-0000[0-{k - 1}].parquet"
    nbytes = sum(r[2] for r in ranges)
    return {**truth, "source": source, "tag": "-part", "samples": samples, "y_sum": y_sum, "ranges": ranges,
            "row_groups": len(ranges), "row_group_bytes": nbytes, "needed_bytes": nbytes, "files": k,
            "footer_bytes": truth["footer_bytes"] * k // truth["files"]}
