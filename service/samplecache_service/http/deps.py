"""FastAPI dependencies shared by the routers: the parts each route uses, and the token check.

A route names the few parts it needs (``EpochsDep``, ``LeasingDep``, ...); the daemon wires them and is the
control surface (pause, configure, quarantine) and the whole-system view that status, metrics and the page
read."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from samplecache_service.daemon import Daemon
from samplecache_service.epochs.jobs import JobTable
from samplecache_service.epochs.leasing import Leasing
from samplecache_service.epochs.manager import EpochManager
from samplecache_service.http.auth import token_problem

# Declares the scheme in the OpenAPI; the check itself happens in the gate (``gate.py``) before the body is
# read, and again here for an app served without the gate.
BEARER = HTTPBearer(auto_error=False, description="The daemon's token (GET /v1/status names its file)")


def get_daemon(request: Request) -> Daemon:
    return request.app.state.daemon  # type: ignore[no-any-return]


def get_epochs(request: Request) -> EpochManager:
    return get_daemon(request).epochs


def get_leasing(request: Request) -> Leasing:
    return get_daemon(request).leasing


def get_jobs(request: Request) -> JobTable:
    return get_daemon(request).jobs


def refusal(request: Request) -> str | None:
    """None when the request carries the daemon's token (or the daemon runs with ``--auth off``); else why not."""
    token: str | None = request.app.state.token
    if token is None:
        return None
    header = request.headers.get("authorization")
    return token_problem(None if header is None else header.encode("latin-1"), token.encode("utf-8"))


def is_authorized(request: Request) -> bool:
    """The request carries the daemon's token, or the daemon runs with ``--auth off``."""
    return refusal(request) is None


def require_token(request: Request,
                  credentials: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None) -> None:
    """Endpoints that change state need ``Authorization: Bearer <token>`` unless ``--auth off``."""
    refused = refusal(request)
    if refused is not None:
        raise HTTPException(401, refused, headers={"WWW-Authenticate": "Bearer"})


DaemonDep = Annotated[Daemon, Depends(get_daemon)]
EpochsDep = Annotated[EpochManager, Depends(get_epochs)]
LeasingDep = Annotated[Leasing, Depends(get_leasing)]
JobsDep = Annotated[JobTable, Depends(get_jobs)]
TokenDep = Depends(require_token)
