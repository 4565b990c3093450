"""The HTTP API: ``create_app(settings)``; the lifespan owns the daemon."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from samplecache import __version__
from samplecache.service import routes_control, routes_epochs, routes_jobs
from samplecache.service.daemon import Daemon
from samplecache.service.deps import DaemonDep
from samplecache.service.jobs import JobError
from samplecache.service.models import Health, Problem, SchemaOut, Status
from samplecache.service.settings import Settings
from samplecache.service.status import status_of

ERRORS: dict[int | str, dict[str, Any]] = {503: {"model": Problem}}


def create_app(settings: Settings, daemon: Daemon | None = None) -> FastAPI:
    """The app. Its lifespan starts and stops the daemon: ``daemon`` (already built) or a new one."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        d = daemon or Daemon(settings)
        app.state.daemon = d
        if daemon is None:
            d.start()
        try:
            yield
        finally:
            await asyncio.to_thread(d.stop)

    app = FastAPI(title="samplecache", version=__version__, lifespan=lifespan,
                  description="A per-host cache of a growing random sample of a remote Parquet dataset.")
    app.include_router(routes_epochs.router)
    app.include_router(routes_control.router)
    app.include_router(routes_jobs.router)

    @app.exception_handler(JobError)
    async def _job_error(request: Request, exc: JobError) -> JSONResponse:
        return JSONResponse({"detail": exc.message, **exc.extra}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(parts) or "bad request"}, status_code=422)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Health:
        return Health()

    @app.get("/readyz", response_model=Health, responses=ERRORS, tags=["health"])
    async def readyz(d: DaemonDep) -> Any:
        if d.schema is None:
            return JSONResponse({"detail": f"not ready: {d.last_error or 'discovering the source'}"}, 503)
        return Health()

    @app.get("/v1/status", response_model=Status, tags=["cache"])
    async def status(d: DaemonDep) -> Status:
        return status_of(d)

    @app.get("/v1/schema", response_model=SchemaOut, responses=ERRORS, tags=["cache"])
    async def schema(d: DaemonDep) -> Any:
        if d.schema is None:
            return JSONResponse({"detail": f"schema not known yet: {d.last_error or 'discovering the source'}"}, 503)
        return SchemaOut(**d.schema.to_json(), skipped_columns=d.discovery.skipped if d.discovery else {},
                         arrow_schema=d.catalog.meta("arrow_schema"))

    return app
