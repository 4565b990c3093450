"""The HTTP API: ``create_app(settings)``; the lifespan owns the daemon."""

from __future__ import annotations

import asyncio
import shutil
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from samplecache import __version__
from samplecache.service import routes_control, routes_epochs
from samplecache.service.daemon import Daemon
from samplecache.service.deps import DaemonDep
from samplecache.service.models import EpochSummary, Health, Problem, SchemaOut, Status
from samplecache.service.settings import Settings

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


def status_of(d: Daemon) -> Status:
    summaries = d.catalog.meta("epoch_summaries", {}) or {}
    epochs = [EpochSummary(epoch=int(k), **v) for k, v in sorted(summaries.items(), key=lambda kv: int(kv[0]))]
    quarantined = [{"path": p, "reason": i.get("reason", ""), "at": i.get("at")}
                   for p, i in d.catalog.files().items() if i.get("quarantined")]
    eps = d.catalog.epochs()
    return Status(
        version=__version__, uptime_s=time.time() - d.started, source=d.settings.source,
        cache_dir=str(d.settings.cache_dir.resolve()), bytes=d.catalog.resident_bytes,
        max_bytes=d.max_bytes, samples=d.catalog.resident_rows, shards=d.catalog.shard_count(),
        map_size=d.map_size, disk_free=shutil.disk_usage(d.settings.cache_dir).free,
        epochs_sealed=len(eps), last_epoch=eps[-1] if eps else -1, epochs=epochs,
        sampler={"state": d.sampler_state(), "reason": d.paused_reason, "processes": d.supervisor.size,
                 "in_flight": d.supervisor.pending(), "restarts": d.supervisor.restarts},
        ingest={**d.ingest_rate(), "commits": d.writer.commits},
        remote_errors=d.remote_errors, last_error=d.last_error, quarantined=quarantined,
        coverage=d.planner.coverage() if d.planner else None, settings=d.settings.public(),
        evictions=d.evicted_shards, eviction_policy=d.policy, leases=[l.to_json() for l in d.leases.live()],
        pinned_epochs=sorted(d.epochs.pinned_epochs()), lmdb=d.lmdb_usage())
