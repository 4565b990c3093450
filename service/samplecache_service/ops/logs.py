"""The daemon's log lines: text for people, or JSON for log shippers (one object per line, stable keys).

One handler on the root logger writes every record; uvicorn's loggers reach it too (the server is started with
``log_config=None``, so its records propagate to the root). A call site names its event and what it is about::

    log.info("shard %d ingested", sid, extra={"event": "shard_ingested", "shard": sid, "path": path, "unit": rg})

A JSON line holds ``ts`` (RFC 3339, UTC), ``level``, ``logger``, ``event``, ``msg``, the context keys that are known
(``CONTEXT_KEYS``) and ``exc`` (a traceback, escaped into the one line). Records without an event (libraries,
uvicorn) get one by their logger (``DEFAULT_EVENTS``). docs/logging.md lists every event. Both formats mask
credentials in the final text (service/samplecache_service/config/redact.py), tracebacks included.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from samplecache_service.config.redact import redact

CONTEXT_KEYS = ("shard", "unit", "job", "epoch", "lease", "error_class", "path", "rows", "bytes", "method", "status")
DEFAULT_EVENTS = {"uvicorn.access": "http_request", "uvicorn.error": "server", "uvicorn": "server",
                  "py.warnings": "python_warning"}
FALLBACK_EVENT = "log"  # a record from a library, with no event of its own
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
UVICORN_LOGGERS = ("uvicorn.error", "uvicorn.access", "uvicorn.asgi")  # uvicorn.Config sets these levels itself
FORMATS = ("text", "json")


def rfc3339(ts: float) -> str:
    """``ts`` (seconds since the epoch) as RFC 3339 UTC with milliseconds: 2025-01-31T12:00:00.123Z."""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_of(record: logging.LogRecord) -> str:
    """The record's ``event``, else its logger's default event, else ``log``."""
    event = record.__dict__.get("event")
    if isinstance(event, str) and event:
        return event
    return DEFAULT_EVENTS.get(record.name, FALLBACK_EVENT)


def _access_context(record: logging.LogRecord) -> dict[str, Any]:
    """uvicorn's access records carry (client, method, path, http version, status) as their arguments."""
    args = record.args
    if record.name != "uvicorn.access" or not isinstance(args, tuple) or len(args) != 5:
        return {}
    return {"method": args[1], "path": args[2], "status": args[4]}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float)) else redact(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages and tracebacks are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": rfc3339(record.created), "level": record.levelname.lower(),
                               "logger": record.name, "event": event_of(record),
                               "msg": redact(record.getMessage().rstrip())}
        context = _access_context(record)
        for key in CONTEXT_KEYS:
            value = record.__dict__.get(key, context.get(key))
            if value is not None:
                out[key] = _plain(value)
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exc"] = redact(record.exc_text)
        if record.stack_info:
            out["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(out, default=str)  # ensure_ascii: no raw U+2028 that a reader might split a line on


class TextFormatter(logging.Formatter):
    """The text format (``TEXT_FORMAT``), with credentials masked in the whole output."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure_logging`` installs (and replaces when called again)."""


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> logging.Handler:
    """Send every record (the daemon's, uvicorn's, libraries', Python warnings) to ``stream`` (default stderr) in
    ``fmt`` ('text' or 'json') at ``level`` and above. Calling it again replaces the handler it installed;
    handlers installed by others (pytest's) stay."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(h)
        h.close()
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT))
    root.addHandler(handler)
    logging.captureWarnings(True)  # warnings.warn(...) as py.warnings records: one format on stderr
    set_level(level)
    return handler


def set_level(level: str) -> None:
    """Change the log level at run time (e.g. on a reload): the root logger's and uvicorn's."""
    value = logging.getLevelName(level.upper())
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {level!r}")
    logging.getLogger().setLevel(value)
    for name in UVICORN_LOGGERS:
        logging.getLogger(name).setLevel(value)
