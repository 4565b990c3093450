"""The ``samplecache`` command: serve, config, status, demo, bench, verify, dev-s3."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Sequence

from samplecache.version import __version__
from samplecache_service.cli.flags import add_setting_flags, load_settings
from samplecache_service.cli.serve import add_serve_parser, cmd_serve
from samplecache_service.cli.status import cmd_status

DEFAULT_URL = "http://127.0.0.1:8750"


def cmd_demo(args: argparse.Namespace) -> int:
    from samplecache_tools.demo import run_demo  # the trainer side: imports torch

    return run_demo(epochs=args.epochs, workdir=args.workdir, port=args.port)


def cmd_bench(args: argparse.Namespace) -> int:
    from samplecache_tools.bench import run_bench  # the trainer side: imports torch

    return run_bench(args.url, max_workers=args.max_workers, batch_size=args.batch_size, passes=args.passes,
                     max_samples=args.max_samples or None)


def cmd_dev_s3(args: argparse.Namespace) -> int:
    from samplecache_tools.devs3 import run_dev_s3  # SeaweedFS and s3fs: the dev-s3 extra

    return run_dev_s3(args.dir, args.upload, bucket=args.bucket, port=args.port)


def cmd_verify(args: argparse.Namespace) -> int:
    from samplecache_service.config.file import ConfigError, load
    from samplecache_service.store.verify import run_verify

    try:
        settings = load({"cache_dir": args.cache_dir}, args.config).settings
    except ConfigError as e:
        print(f"samplecache verify: {e}", file=sys.stderr)
        return 2
    return run_verify(settings.lmdb_path, quick=args.quick, as_json=args.json)


def cmd_config(args: argparse.Namespace) -> int:
    from samplecache_service.config.file import ConfigError, exposed_secrets, option_sources, shown, table_traps
    from samplecache_service.config.mapsize import map_problem

    try:
        loaded = load_settings(args)
    except ConfigError as e:
        print(f"samplecache config: {e}", file=sys.stderr)
        return 2
    # valid, but more than this machine can map: serve would fail opening LMDB
    problem = map_problem(int(loaded.settings.max_bytes))
    if problem:
        print(f"samplecache config: invalid settings:\n  {problem} (from {loaded.sources['max_bytes']})",
              file=sys.stderr)
        return 2
    values = shown(loaded.settings)
    warnings = exposed_secrets(loaded) + table_traps(loaded.config)
    for warning in warnings:
        print(f"samplecache config: warning: {warning}", file=sys.stderr)
    options = option_sources(loaded)
    if args.json:
        settings = {n: {"value": v, "source": loaded.sources[n]} for n, v in values.items()}
        settings["storage_options"]["sources"] = options  # each option's own line
        print(json.dumps({"config_file": str(loaded.config.path) if loaded.config.path else None,
                          "settings": settings, "warnings": warnings}, indent=2))
        return 0
    print(f"# config file: {loaded.config.path or 'none'}")
    for warning in warnings:
        print(f"# warning: {warning}")
    rows = []
    for n, v in values.items():
        if n == "storage_options" and options:  # one row per option, each with its own source line
            rows += [(f"{n}.{k}", v[k], src) for k, src in options.items()]
        else:
            rows.append((n, v, loaded.sources[n]))
    w = max(len(n) for n, _, _ in rows)
    vw = min(48, max(len(json.dumps(v)) for _, v, _ in rows))
    for n, v, src in rows:
        print(f"{n.ljust(w)}  {json.dumps(v).ljust(vw)}  {src}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="samplecache", description="A per-host cache of a growing random sample "
                                "of a remote Parquet dataset, for PyTorch training.")
    p.add_argument("--version", action="version", version=f"samplecache {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    c = sub.add_parser("config", help="print the effective settings and where each came from (secrets masked)",
                       description="Print the settings `samplecache serve` would run with, given the same flags, "
                                   "environment and config file, and the source of each: flag, env, config "
                                   "FILE:LINE or default. Exit 2 on a bad value, naming where it came from.")
    add_setting_flags(c)
    c.add_argument("--json", action="store_true", help="print JSON")
    st = sub.add_parser("status", help="print the daemon's status as a table")
    st.add_argument("--url", default=DEFAULT_URL, help=f"daemon URL (default {DEFAULT_URL})")
    st.add_argument("--json", action="store_true", help="print the raw JSON")
    d = sub.add_parser("demo", help="train a small model through a local daemon on an embedded dataset")
    d.add_argument("--epochs", type=int, default=8, help="training epochs (default 8: the cache fills, then rolls)")
    d.add_argument("--workdir", default=None, help="where the demo's source data and cache go (default: a temp dir)")
    d.add_argument("--port", type=int, default=0, help="daemon port (default: a free one)")
    b = sub.add_parser("bench", help="measure the client on this host's cache at num_workers 0..N and recommend one")
    b.add_argument("--url", default=DEFAULT_URL, help=f"daemon URL (default {DEFAULT_URL})")
    b.add_argument("--max-workers", type=int, default=None,
                   help="highest num_workers to try (default: cores, at most 8)")
    b.add_argument("--batch-size", type=int, default=256)
    b.add_argument("--passes", type=int, default=2, help="warm passes per setting (after one warm-up)")
    b.add_argument("--max-samples", type=int, default=200_000, help="samples per pass at most (0: the whole epoch)")
    ds = sub.add_parser("dev-s3", help="run a local S3 (SeaweedFS on 127.0.0.1) to try samplecache on, and upload "
                        "a Parquet dir to it", description="Start SeaweedFS's S3 on 127.0.0.1:PORT with its data and "
                        "log in DIR, make a bucket, upload --upload's files, print the daemon's command, and serve "
                        "until Ctrl-C. Needs the dev-s3 extra (pip install 'samplecache[dev-s3]').")
    ds.add_argument("--dir", required=True, help="the server's data, log and sockets (kept; reused by a restart)")
    ds.add_argument("--upload", default=None, metavar="PATH",
                    help="a Parquet dir (or file) to upload to s3://BUCKET/<its name>/")
    ds.add_argument("--bucket", default="samplecache", help="bucket to make (default samplecache)")
    ds.add_argument("--port", type=int, default=8333, help="S3 port (default 8333; its gRPC port is PORT+10000)")
    v = sub.add_parser("verify", help="check every block of the cache against its checksum (beside a live daemon "
                       "too); exit 0 clean, 1 damaged, 2 no cache to check")
    v.add_argument("--cache-dir", default=None, help="the daemon's --cache-dir (default: SAMPLECACHE_CACHE_DIR or "
                   "./samplecache-data)")
    v.add_argument("--config", default=None, metavar="FILE", help="the daemon's config file, for its cache_dir")
    v.add_argument("--quick", action="store_true", help="check block headers and that every block is there, "
                   "not the checksums (reads a page per block)")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"serve": cmd_serve, "config": cmd_config, "status": cmd_status, "demo": cmd_demo, "bench": cmd_bench,
               "verify": cmd_verify, "dev-s3": cmd_dev_s3}[args.command]
    try:
        code = int(handler(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`samplecache status | head`): stop quietly with SIGPIPE's status, as Unix tools
        # do; stdout points at /dev/null so that the flush at exit cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code
