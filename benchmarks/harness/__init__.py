"""The benchmark harness: what every benchmark under ``benchmarks/`` shares. Each benchmark is a short
``main`` over it; run them from the repository root as ``python -m benchmarks.<name>``.

Modules (each documents its part; the names below are re-exported here):

* ``data``    generated datasets and their ground truth: ``Spec`` (one dataset: samples, row group, dtype,
              width, batch, seed, rows per file; ``.payload``, ``.params()``), ``make_specs(n_small, n_large,
              quick)`` (SMALL 256 B uint8 / LARGE 1 MiB float32), ``Check`` (the x checksum per sample, block,
              batch), ``write_parquet(spec, open_file)`` (any writable opener; returns ``{"samples", "y_sum",
              "x_check", "files"}``), ``generate(spec, root, log)`` (local, reused),
              ``parquet_files(dir)`` and ``arrow_xy(table, width)`` (the files and their rows read back),
              ``read_json``, ``write_json``, ``MB`` (10**6), ``BENCH_FORMAT``, ``LARGE_STRIDE``.
* ``daemon``  the real daemon: ``start_daemon(source, cache, samplers=, max_bytes=, log_path=, extra=, env=,
              ready=)`` -> ``DaemonProcess``, ``stop_daemon(d)``, ``wait_samples(d, n, log, name=, budget=)``,
              ``wait_idle(d, t0)``, ``fetch_epoch(d, 0)``, ``all_shards(d)``, ``http_json``, ``http_get``,
              ``http_post``;
              for a generated ``Spec``: ``build_cache(spec, root, log)`` -> epoch 0's manifest (reused) and
              ``serve(spec, root, manifest)`` -> the idle daemon on it.
* ``s3``      a real S3 server: ``s3_server(root)`` (context manager; ``samplecache_tools.s3server.S3Server``),
              ``s3fs_options(s3)``, ``upload(spec, fs, prefix, log)``, ``row_group_ranges(fs, prefix)``.
* ``verify``  ``Row`` (one loader row: passes, median, samples/s, MB/s, ``verified``, ``status``, ``error``,
              ``missing``), ``Tally``, ``measure(row, one_pass, passes, log)`` (warm-up + timed passes, each
              verified against ``row.expected``), ``fail``, ``batches_pass``, ``lmdb_scan`` (the raw LMDB limit),
              ``lmdb_check`` (count and sum of y read back), ``release_cache``.
* ``cli``     ``parser(__doc__)``, ``common(p)`` (``--quick``, ``--json``, ``--workdir``), ``loader_sizes(p)`` and
              ``sizes(a, p)`` (``--small/--large/--passes``), ``subset``, ``ints``, ``parse_size('200MB')``,
              ``human(n)``, ``log`` (stderr).
* ``report``  ``host(load_start, dists, **extra)`` (the JSON host block: python, platform, cpus, load average,
              versions), ``machine(dists)``, ``loadavg()``, ``load_note``, ``versions``, ``git_state``, ``fmt``,
              ``rows_json``, ``text_table``, ``write_report``, ``exit_code``, ``finish(path, result, rows)``.
* ``needs``   optional peers and tools: ``missing(key)`` -> None or "not installed (...); install: CMD",
              ``require(key)`` (raises ``Missing``), ``missing_report``, ``missing_lines``, ``print_missing``,
              ``find_tool``,
              ``NEEDS`` (streaming, litdata, webdataset, tensorflow, torch, s3fs, py-spy, seaweedfs, fincore).

A benchmark's outline:

    from benchmarks.harness import cli, report
    from benchmarks.harness import *   # or name what it uses

    def main(argv=None) -> int:
        p = cli.parser(__doc__); cli.common(p); a = p.parse_args(argv)
        load_start = report.loadavg()
        rows = [...]                      # measure(Row(...), one_pass, passes, cli.log) per loader
        print(table(rows))
        return report.finish(a.json, {"benchmark": NAME, "host": report.host(load_start), "rows": ...}, rows)
"""

from __future__ import annotations

from .cli import common, human, ints, loader_sizes, log, parse_size, parser, sizes, subset
from .daemon import (
                     all_shards,
                     build_cache,
                     fetch_epoch,
                     http_get,
                     http_json,
                     http_post,
                     serve,
                     start_daemon,
                     stop_daemon,
                     wait_idle,
                     wait_samples,
)
from .data import (
                     BENCH_FORMAT,
                     LARGE_STRIDE,
                     MB,
                     Check,
                     Spec,
                     arrow_xy,
                     generate,
                     make_specs,
                     parquet_files,
                     read_json,
                     write_json,
                     write_parquet,
)
from .needs import NEEDS, Missing, find_tool, missing, missing_lines, missing_report, print_missing, require
from .report import (
                     exit_code,
                     finish,
                     fmt,
                     host,
                     load_note,
                     loadavg,
                     machine,
                     rows_json,
                     text_table,
                     versions,
                     write_report,
)
from .s3 import row_group_ranges, s3_server, s3fs_options, upload
from .verify import Row, Tally, batches_pass, fail, lmdb_check, lmdb_scan, measure, release_cache

__all__ = [
    "BENCH_FORMAT", "LARGE_STRIDE", "MB", "NEEDS", "Check", "Missing", "Row", "Spec", "Tally", "all_shards", "arrow_xy",
    "batches_pass", "build_cache", "common", "exit_code", "fail", "fetch_epoch", "find_tool", "finish", "fmt",
    "generate", "host", "http_get", "http_json", "http_post", "human", "ints", "lmdb_check", "lmdb_scan",
    "load_note", "loadavg",
    "loader_sizes", "log", "machine", "make_specs", "measure", "missing", "missing_lines", "missing_report",
    "parquet_files", "parse_size", "parser", "print_missing", "read_json", "release_cache", "require",
    "row_group_ranges", "rows_json", "s3_server", "s3fs_options", "serve", "sizes", "start_daemon", "stop_daemon",
    "subset", "text_table", "upload", "versions", "wait_idle", "wait_samples", "write_json", "write_parquet",
    "write_report",
]
