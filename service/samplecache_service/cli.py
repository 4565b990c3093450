"""The ``samplecache`` command: serve, config, status, demo, bench, verify, dev-s3."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import urllib.error
import urllib.request
from typing import Any, Iterator, Sequence

from samplecache.version import __version__

DEFAULT_URL = "http://127.0.0.1:8750"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _setting_flags(p: argparse.ArgumentParser) -> None:
    """``--config`` and one flag per setting (the default None: not given, so the next source decides)."""
    from samplecache_service.config.file import CONFIG_ENV, DEFAULT_CONFIG
    from samplecache_service.config.settings import Settings

    p.add_argument("--config", default=None, metavar="FILE",
                   help=f"TOML config file (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG} if it exists); flags and "
                        f"SAMPLECACHE_* environment win over it")
    for name, field in Settings.model_fields.items():
        kw: dict[str, Any] = {"dest": name, "default": None, "help": field.description}
        if name in ("storage_options", "iceberg_catalogs"):
            kw["metavar"] = "JSON"
        if name in ("source", "share"):  # --source URL, or --source NAME=URL many times; --share NAME=F many times
            kw["action"] = "append"
        p.add_argument(_flag(name), **kw)


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the daemon", description="Run the daemon. Every setting is a flag, a "
                       "SAMPLECACHE_<NAME> environment variable and a key of the config file; flags win over the "
                       "environment, which wins over the file. SIGHUP reloads the settings that can change at run "
                       "time.")
    _setting_flags(p)
    # a flag only, never a setting in the environment: under a service manager it would reset on every restart
    p.add_argument("--reset-cache", action="store_true", dest="reset_cache_once",
                   help="drop the cache dir's LMDB cache and staging files, then start empty (the way out of a "
                        "damaged or old-format cache; the sealed epochs are lost)")


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    from samplecache_service.config.settings import Settings, named_pairs

    flags = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    given = flags.pop("source", None) or []
    bare = [u for u in given if not _is_named(u)]
    if len(bare) > 1:
        raise SystemExit(f"samplecache: --source given {len(bare)} bare URLs; name each source: --source NAME=URL")
    if bare:
        flags["source"] = bare[0]
    named = [u for u in given if _is_named(u)]
    if named:
        flags["sources"] = {**_as_dict(flags.get("sources")), **named_pairs(named, "URL")}
    return flags


def _is_named(value: str) -> bool:
    """``NAME=URL``, not a URL (whose own ``=`` comes after its scheme or a ``/``)."""
    head, eq, _ = value.partition("=")
    return bool(eq) and all(c.islower() or c.isdigit() or c in "_-" for c in head) and 0 < len(head) <= 64


def _as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        from samplecache_service.config.settings import named_pairs
        return dict(json.loads(value)) if value.strip().startswith("{") else named_pairs(value, "URL")
    return dict(value)


def _load(args: argparse.Namespace) -> Any:
    """The effective settings and their sources (service/samplecache_service/config/file.py); raises ConfigError."""
    from samplecache_service.config.file import load

    return load(_flags(args), getattr(args, "config", None))


def _settings_from(args: argparse.Namespace) -> Any:
    return _load(args).settings


def _server(config: Any, on_hup: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM after a graceful shutdown (the process then dies of it);
        a daemon should stop its work and exit 0 instead."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self.handle_exit)
            signal.signal(signal.SIGHUP, lambda signum, frame: on_hup())
            yield

    return Server(config)


def _startup_failed(settings: Any, message: str) -> None:
    """serve's one line on why it cannot start: on stderr, or as a JSON log line with ``--log-format json``."""
    from samplecache_service.config.redact import redact

    if settings.log_format == "json":  # every line of the log one JSON object, this one too
        logging.getLogger("samplecache.cli").error("samplecache serve: %s", message, extra={"event": "startup_failed"})
    else:
        print(f"samplecache serve: {redact(message)}", file=sys.stderr)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from samplecache_service.config.file import ConfigError, exposed_secrets, table_traps
    from samplecache_service.daemon import Daemon
    from samplecache_service.http.app import create_app
    from samplecache_service.http.listen import PORT_IN_USE, listen_problem
    from samplecache_service.ops.logs import configure_logging, set_level
    from samplecache_service.ops.reload import Reloader
    from samplecache_service.remote.stores import RemoteError
    from samplecache_service.store.cachedir import DamagedCacheFile, StartupError
    from samplecache_service.store.lmdbmap import BadSetting

    try:
        loaded = _load(args)
    except ConfigError as e:
        print(f"samplecache serve: {e}", file=sys.stderr)
        return 2
    settings = loaded.settings
    # a SIGHUP while the daemon starts (a slow first listing of the remote) is held for the reloader: Python's
    # default action would end the process
    held: list[int] = []
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: held.append(signum))
    configure_logging(settings.log_level, settings.log_format)  # uvicorn's records too (log_config=None below)
    for warning in exposed_secrets(loaded):
        logging.getLogger("samplecache.cli").warning("%s", warning, extra={"event": "secret_exposed"})
    for warning in table_traps(loaded.config):
        logging.getLogger("samplecache.cli").warning("%s", warning, extra={"event": "config_key_in_table"})
    # before the cache is opened and the source listed: a port in use is said at once, in one line
    busy = listen_problem(settings.host, settings.port)
    if busy:
        _startup_failed(settings, busy)
        signal.signal(signal.SIGHUP, previous)
        return PORT_IN_USE
    try:
        daemon = Daemon(settings, reset=bool(getattr(args, "reset_cache_once", False)))
        daemon.check_remote()
        app = create_app(settings, daemon)  # resolves the API token (a bad token file stops here, in one line)
    except (StartupError, RemoteError) as e:
        _startup_failed(settings, str(e))
        if "daemon" in locals():
            daemon.stop()
        signal.signal(signal.SIGHUP, previous)
        return 2 if isinstance(e, (DamagedCacheFile, BadSetting)) else 1
    reloader = Reloader(_flags(args), args.config, loaded, daemon, set_level)
    daemon.config_state = reloader.state
    reloader.start()
    daemon.start()
    signal.signal(signal.SIGHUP, lambda signum, frame: reloader.request())
    if held:
        reloader.request()
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            log_config=None, timeout_graceful_shutdown=5, access_log=settings.log_level == "debug")
    try:
        _server(config, reloader.request).run()
    except SystemExit as e:  # uvicorn could not start (say, the port was taken meanwhile): it logged why, exits 3
        if e.code != PORT_IN_USE:
            raise
        _startup_failed(settings, f"the HTTP server on {settings.host}:{settings.port} could not start (the line "
                                  f"above says why)")
        return PORT_IN_USE
    finally:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no reload while the daemon stops
        daemon.stop()
    if daemon.health.fatal:
        if settings.log_format != "json":  # the JSON log has it already (event daemon_fatal)
            print(f"samplecache serve: stopped: {daemon.health.fatal}", file=sys.stderr)
        return 1  # the service manager restarts it
    return 0


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise SystemExit(f"samplecache: {url} answered {e.code}: {e.read()[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SystemExit(f"samplecache: cannot reach the daemon at {url}: {getattr(e, 'reason', e)}") from None


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _files_row(files: dict[str, Any] | None) -> str:
    """``3 Parquet files, 2 other file(s) skipped: README.txt, data.csv`` (``-`` before the first listing)."""
    if not files:
        return "-"
    out = f"{files['parquet']} Parquet files" + (f", {files['skipped_text']}" if files["skipped"] else "")
    if files.get("filter"):
        out += f"; --filter {files['filter']} leaves out {files.get('outside_filter', 0)}"
    return out


def _table_row(t: dict[str, Any]) -> str:
    """``delta version 3 (newest), 4 live files, 150 rows; 2 files removed``."""
    pinned = "pinned" if t["pinned"] else "newest"
    return (f"{t['format']} version {t['version']} ({pinned}), {t['files']} live files, {t['rows']} rows; "
            f"{t['removed_files']} files removed")


def format_status(s: dict[str, Any]) -> str:
    cov = s.get("coverage") or {}
    rows = [
        ("source", s["source"]),
        ("cache dir", s["cache_dir"]),
        ("resident", f"{human(s['bytes'])} of {human(s['max_bytes'])} ({s['samples']} samples, {s['shards']} shards)"),
        ("disk free", human(s["disk_free"])),
        ("sampler", f"{s['sampler']['state']}" + (f" ({s['sampler']['reason']})" if s["sampler"]["reason"] else "")
         + f", {s['sampler']['processes']} processes, {s['sampler']['in_flight']} in flight"),
        ("ingest", f"{s['ingest']['samples_per_s']:.1f} samples/s, {human(s['ingest']['bytes_per_s'])}/s"),
        ("remote read", f"{human(s['remote']['bytes_read'])} ({human(s['remote']['bytes_since_last_epoch'])} since "
                        f"the last epoch)"),
        ("pacing", f"{s['pacing']['mode']}, {s['pacing']['replace_per_epoch']:g} x budget per epoch"
                   + (f", at most {human(s['pacing']['max_ingest_rate'])}/s" if s["pacing"]["max_ingest_rate"] else "")
                   + (f" ({s['pacing']['reason']})" if s["pacing"]["reason"] else "")),
        ("jobs", f"{s['jobs']} (GET /v1/jobs)"),
        ("files", _files_row(s.get("files"))),
        *([("table", _table_row(s["table"]))] if s.get("table") else []),
        ("coverage", f"{cov.get('units_sampled', 0)}/{cov.get('units', 0)} row groups, "
                     f"{100 * cov.get('row_fraction', 0):.1f}% of rows, pass {cov.get('cycle', 0)}" if cov else "-"),
        ("epochs sealed", f"{s['epochs_sealed']} (last {s['last_epoch']})"),
        ("remote errors", f"{s['remote_errors']}" + (f" (last: {s['last_error']})" if s["last_error"] else "")),
        ("quarantined", str(len(s["quarantined"]))),
    ]
    w = max(len(k) for k, _ in rows)
    out = [f"{k.ljust(w)}  {v}" for k, v in rows]
    if s["epochs"]:
        out.append("")
        out.append("epoch   samples     new  shards  remote read")
        out += [f"{e['epoch']:>5} {e['samples']:>9} {e['new_samples']:>7} {e['shards']:>7}  "
                f"{human(e.get('remote_bytes', 0)):>11}" for e in s["epochs"][-10:]]
    for q in s["quarantined"][:10]:
        out.append(f"quarantined: {q['path']}: {q['reason']}")
    for name, why in (s.get("skipped_columns") or {}).items():
        out.append(f"column left out: {name}: {why}")
    if s.get("sources"):
        out.append("")
        out += _sources_table(s["sources"])
    return "\n".join(out)


def _sources_table(sources: list[dict[str, Any]]) -> list[str]:
    """A row per named source: its share, what it holds of it, its state, and what is wrong (or why it waits)."""
    heads = ("name", "share", "resident", "samples", "shards", "state", "problem")
    rows = [(s["name"], f"{100 * s['share']:.1f}%", f"{human(s['bytes'])} of {human(s['max_bytes'])}",
             str(s["samples"]), str(s["shards"]), s["state"],
             " ".join(str(s.get("problem") or s.get("reason") or "-").split())) for s in sources]
    widths = [max(len(r[i]) for r in (heads, *rows)) for i in range(len(heads))]
    right = (1, 2, 3, 4)  # the numbers
    return ["  ".join(c.rjust(w) if i in right else c if i == len(heads) - 1 else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths))) for r in (heads, *rows)]


def cmd_status(args: argparse.Namespace) -> int:
    s = _get(args.url.rstrip("/") + "/v1/status")
    print(json.dumps(s, indent=2) if args.json else format_status(s))
    return 0


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
        loaded = _load(args)
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
    _serve_parser(sub)
    c = sub.add_parser("config", help="print the effective settings and where each came from (secrets masked)",
                       description="Print the settings `samplecache serve` would run with, given the same flags, "
                                   "environment and config file, and the source of each: flag, env, config "
                                   "FILE:LINE or default. Exit 2 on a bad value, naming where it came from.")
    _setting_flags(c)
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
