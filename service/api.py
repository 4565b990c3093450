"""The HTTP API: ``create_app(settings)``; the lifespan owns the daemon."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from contextlib import asynccontextmanager
from typing import Annotated, Any, AsyncIterator

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from samplecache import __version__
from samplecache.service.daemon import Daemon
from samplecache.service.epochs import EpochError
from samplecache.service.models import EpochSummary, Health, Problem, SchemaOut, Status
from samplecache.service.settings import Settings

ERRORS: dict[int | str, dict[str, Any]] = {400: {"model": Problem}, 404: {"model": Problem},
                                           409: {"model": Problem}, 503: {"model": Problem}}


def get_daemon(request: Request) -> Daemon:
    return request.app.state.daemon  # type: ignore[no-any-return]


D = Annotated[Daemon, Depends(get_daemon)]


def create_app(settings: Settings, daemon: Daemon | None = None) -> FastAPI:
    """The app. Without ``daemon`` the lifespan builds, starts and stops one."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        d = daemon or Daemon(settings)
        app.state.daemon = d
        if daemon is None:
            d.start()
        try:
            yield
        finally:
            if daemon is None:
                await asyncio.to_thread(d.stop)

    app = FastAPI(title="samplecache", version=__version__, lifespan=lifespan,
                  description="A per-host cache of a growing random sample of a remote Parquet dataset.")

    def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
        if settings.token and authorization != f"Bearer {settings.token}":
            raise HTTPException(401, "this endpoint needs 'Authorization: Bearer <token>' (SAMPLECACHE_TOKEN)")

    app.state.require_token = require_token

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(parts) or "bad request"}, status_code=422)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Health:
        return Health()

    @app.get("/readyz", response_model=Health, responses=ERRORS, tags=["health"])
    async def readyz(d: D) -> Any:
        if d.schema is None:
            return JSONResponse({"detail": f"not ready: {d.last_error or 'discovering the source'}"}, 503)
        return Health()

    @app.get("/v1/status", response_model=Status, tags=["cache"])
    async def status(d: D) -> Status:
        return status_of(d)

    @app.get("/v1/schema", response_model=SchemaOut, responses=ERRORS, tags=["cache"])
    async def schema(d: D) -> Any:
        if d.schema is None:
            return JSONResponse({"detail": f"schema not known yet: {d.last_error or 'discovering the source'}"}, 503)
        return SchemaOut(**d.schema.to_json(), skipped_columns=d.skipped_columns,
                         arrow_schema=d.catalog.meta("arrow_schema"))

    @app.get("/v1/epochs/{epoch}", responses={200: {"description": "The sealed manifest (JSON)"}, **ERRORS},
             tags=["epochs"])
    async def epoch(d: D, epoch: Annotated[int, Path(ge=0, le=2**62, description="Epoch number, from 0")],
                    min_samples: Annotated[int, Query(ge=0, le=2**62, description="Wait until the cache holds this many samples before sealing")] = 1,
                    timeout: Annotated[float, Query(ge=0, le=3600, description="Longest wait for min_samples (s)")] = 30.0) -> Response:
        """The manifest of ``epoch``. The first call seals it from the shards resident now."""
        if d.schema is None and d.catalog.manifest_bytes(epoch) is None:
            raise HTTPException(503, f"the source is not discovered yet: {d.last_error or 'discovering'}",
                                headers={"Retry-After": "2"})
        try:
            raw = await d.epochs.manifest(epoch, min_samples, timeout)
        except EpochError as e:
            headers = {"Retry-After": str(int(e.retry_after))} if e.retry_after else None
            raise HTTPException(e.status, e.message, headers=headers) from None
        return Response(raw, media_type="application/json")

    return app


def status_of(d: Daemon) -> Status:
    summaries = d.catalog.meta("epoch_summaries", {}) or {}
    epochs = [EpochSummary(epoch=int(k), **v) for k, v in sorted(summaries.items(), key=lambda kv: int(kv[0]))]
    quarantined = [{"path": p, "reason": i.get("reason", ""), "at": i.get("at")}
                   for p, i in d.catalog.files().items() if i.get("quarantined")]
    eps = d.catalog.epochs()
    return Status(
        version=__version__, uptime_s=time.time() - d.started, source=d.settings.source,
        cache_dir=str(d.settings.cache_dir.resolve()), bytes=d.catalog.resident_bytes,
        max_bytes=int(d.settings.max_bytes), samples=d.catalog.resident_rows, shards=len(d.catalog.shards()),
        map_size=d.map_size, disk_free=shutil.disk_usage(d.settings.cache_dir).free,
        epochs_sealed=len(eps), last_epoch=eps[-1] if eps else -1, epochs=epochs,
        sampler={"state": d.sampler_state(), "reason": d.paused_reason, "processes": d.supervisor.size,
                 "in_flight": d.supervisor.pending(), "restarts": d.supervisor.restarts},
        ingest={**d.ingest_rate(), "commits": d.writer.commits},
        remote_errors=d.remote_errors, last_error=d.last_error, quarantined=quarantined,
        coverage=d.planner.coverage() if d.planner else None, settings=d.settings.public())
