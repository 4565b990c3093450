"""``samplecache serve``: the daemon behind uvicorn, its signals (SIGHUP reloads) and why it could not start."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from typing import Any, Iterator

from samplecache_service.cli.flags import add_setting_flags, given_flags, load_settings


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the daemon", description="Run the daemon. Every setting is a flag, a "
                       "SAMPLECACHE_<NAME> environment variable and a key of the config file; flags win over the "
                       "environment, which wins over the file. SIGHUP reloads the settings that can change at run "
                       "time.")
    add_setting_flags(p)
    # a flag only, never a setting in the environment: under a service manager it would reset on every restart
    p.add_argument("--reset-cache", action="store_true", dest="reset_cache_once",
                   help="drop the cache dir's LMDB cache and staging files, then start empty (the way out of a "
                        "damaged or old-format cache; the sealed epochs are lost)")


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
        loaded = load_settings(args)
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
    reloader = Reloader(given_flags(args), args.config, loaded, daemon, set_level)
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
        if not reloader.stop():
            logging.getLogger("samplecache.cli").error(
                "a settings reload is still running at stop", extra={"event": "stop_left_reload_running"})
        daemon.stop()
    if daemon.health.fatal:
        if settings.log_format != "json":  # the JSON log has it already (event daemon_fatal)
            print(f"samplecache serve: stopped: {daemon.health.fatal}", file=sys.stderr)
        return 1  # the service manager restarts it
    return 0
