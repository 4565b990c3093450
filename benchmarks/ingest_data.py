"""The two datasets of benchmarks/ingest.py (``harness.Spec``, written by ``harness.upload`` to the S3 server)
and their truth: sample count, sum of ``y``, every row group's byte range, the bytes of the column chunks
(what a sampler must fetch at least) and of the footers.

* LARGE: ``x`` = fixed_size_list<float32, 262144> (1 MiB) + int64 ``y``, 16 rows (16.8 MB) per row group;
* SMALL: ``x`` = fixed_size_list<uint8, 256> + int64 ``y``, 50,000 rows (13.2 MB) per row group;

4 row groups per file, random (incompressible), written uncompressed. ``--quick``: 4 and 5,000 rows per group.
"""

from __future__ import annotations

from typing import Any

from .harness import MB, Spec, log, row_group_ranges, upload

BUCKET = "samplecache-bench"


def make_specs(large_mb: float, small_mb: float, quick: bool) -> dict[str, Spec]:
    lrg, srg = (4, 5_000) if quick else (16, 50_000)
    nl = max(lrg, int(large_mb * MB / (1 << 20)) // lrg * lrg)
    ns = max(srg, int(small_mb * MB / 264) // srg * srg)
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
