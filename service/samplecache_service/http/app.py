"""The HTTP API: ``create_app(settings)``; the lifespan owns the daemon.

Every error reply is ``{"detail": "<text>"}`` (the ``Problem`` model). Typed service errors become statuses
here, in one table (``STATUS``); the gate (``gate.py``) answers 401 and 413 before a route runs."""

from __future__ import annotations

import asyncio
import re
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from samplecache.version import __version__
from samplecache_service.config.redact import redact
from samplecache_service.config.settings import Settings
from samplecache_service.daemon import Daemon
from samplecache_service.errors import Conflict, Gone, Invalid, NotFound, NotReady, ServiceError, TooMany
from samplecache_service.http import page
from samplecache_service.http.apidocs import add_docs
from samplecache_service.http.auth import resolve_token
from samplecache_service.http.deps import DaemonDep
from samplecache_service.http.gate import RequestGate
from samplecache_service.http.metrics import add_metrics
from samplecache_service.http.models import Health, Problem, SchemaOut, SourceStatus, Status, problems
from samplecache_service.http.routes import control, epochs, jobs, quarantine
from samplecache_service.http.status import sources_of, status_of
from samplecache_service.store.catalog import source_key

ERRORS: dict[int | str, dict[str, Any]] = {503: {"model": Problem}}
STATUS: dict[type[ServiceError], int] = {Invalid: 422, NotFound: 404, Conflict: 409, Gone: 410, TooMany: 429,
                                          NotReady: 503}
MAX_PROBLEMS, MAX_NAME, MAX_MESSAGE = 5, 64, 200  # a 422 names at most this much: never the values sent
_UNION_BRANCH = re.compile(r"^(constrained-)?(int|str|float|bool|none|literal\[.*\]|function-\w+\[.*\])$")


def problem_reply(exc: Exception) -> JSONResponse:
    """The reply to a typed error: ``{"detail": ..., **extra}``."""
    status = next((STATUS[c] for c in type(exc).__mro__ if c in STATUS), 400)
    extra = dict(getattr(exc, "extra", None) or {})
    retry = getattr(exc, "retry_after", None)
    headers = {"Retry-After": str(max(1, int(retry)))} if retry else None
    message = getattr(exc, "message", None) or str(exc)
    return JSONResponse({"detail": message, **extra}, status_code=status, headers=headers)


def validation_detail(errors: Sequence[Any]) -> str:
    """Which fields are wrong and how, from pydantic's errors: the field names (cut short) and the rule broken,
    never the value sent (a 50 MB value is not echoed)."""
    by_field: dict[str, list[str]] = {}
    for e in errors:
        loc = [str(p)[:MAX_NAME] for p in e.get("loc", ()) if not _UNION_BRANCH.match(str(p))]
        msgs = by_field.setdefault(".".join(loc) or "request", [])
        msg = str(e.get("msg", "invalid"))[:MAX_MESSAGE]
        if msg not in msgs:
            msgs.append(msg)
    parts = [f"{where}: {' or '.join(msgs)}" for where, msgs in list(by_field.items())[:MAX_PROBLEMS]]
    more = len(by_field) - MAX_PROBLEMS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "") if parts else "bad request"


def create_app(settings: Settings, daemon: Daemon | None = None) -> FastAPI:
    """The app. Its lifespan starts and stops the daemon: ``daemon`` (already built) or a new one."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        d = daemon or Daemon(settings)
        app.state.daemon = d
        metrics.start(d)  # GET /metrics reads d; the HTTP timer learns the route templates
        if daemon is None:
            d.start()
        try:
            yield
        finally:
            await asyncio.to_thread(d.stop)

    app = FastAPI(title="samplecache", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="A per-host cache of a growing random sample of a remote Parquet dataset.")
    add_docs(app)  # /docs served offline (apidocs.py); no /redoc
    app.include_router(page.router)  # GET /: the status page
    app.include_router(epochs.router)
    app.include_router(control.router)
    app.include_router(jobs.router)
    app.include_router(quarantine.router)
    app.state.token = resolve_token(settings)  # StartupError when the token file cannot be used
    app.add_middleware(RequestGate, token=app.state.token, max_body_bytes=int(settings.max_body_bytes))
    metrics = add_metrics(app, daemon)  # GET /metrics; its HTTP timer goes outside the gate

    async def _typed(request: Request, exc: Exception) -> JSONResponse:
        return problem_reply(exc)

    app.add_exception_handler(ServiceError, _typed)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_detail(exc.errors())}, status_code=422)

    @app.get("/healthz", response_model=Health, responses=ERRORS, tags=["health"], response_model_exclude_none=True)
    async def healthz(d: DaemonDep) -> Any:
        """200 while every background thread works; 503 with the reasons when one fails, stalls or died."""
        problems = d.health.problems()
        if problems:
            return JSONResponse({"detail": "; ".join(problems)}, 503)
        if len(d.sources) > 1:
            return Health(sources={n: redact(s.problem() or "ok") for n, s in d.sources.items()})
        return Health()

    @app.get("/readyz", response_model=Health, responses=ERRORS, tags=["health"], response_model_exclude_none=True)
    async def readyz(d: DaemonDep) -> Any:
        if d.schema is None:
            return JSONResponse({"detail": f"not ready: {d.last_error or 'discovering the source'}"}, 503)
        return Health()

    @app.get("/v1/status", response_model=Status, tags=["cache"])
    async def status(d: DaemonDep) -> Status:
        return status_of(d)

    @app.get("/v1/sources", response_model=list[SourceStatus], tags=["cache"])
    async def sources(d: DaemonDep) -> list[SourceStatus]:
        """Each named source: URL, share, what it holds, coverage, remote bytes, errors, quarantined files."""
        return sources_of(d)

    @app.get("/v1/schema", response_model=SchemaOut, responses={**ERRORS, **problems(404, 422)}, tags=["cache"])
    async def schema(d: DaemonDep, source: str | None = None) -> Any:
        """The schema of ``source`` (default: the first source; ``GET /v1/sources`` names them)."""
        if source is not None and source not in d.sources:
            raise NotFound(f"no source {source!r}; the sources are {sorted(d.sources)}")
        src = d.sources[source] if source is not None else next(iter(d.sources.values()), None)
        got = src.scheduler.schema() if src is not None else None
        if got is None or src is None:
            why = (src.scheduler.last_error if src is not None else None) or "discovering the source"
            return JSONResponse({"detail": f"schema not known yet: {redact(why)}"}, 503)
        return SchemaOut(**got.to_json(), skipped_columns=src.discovery.skipped if src.discovery else {},
                         arrow_schema=d.catalog.meta(source_key(src.name, "arrow_schema")))

    return app
