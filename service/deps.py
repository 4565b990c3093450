"""FastAPI dependencies shared by the routers: the daemon and the token check."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request

from samplecache.service.daemon import Daemon



def get_daemon(request: Request) -> Daemon:
    return request.app.state.daemon  # type: ignore[no-any-return]


def require_token(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """Endpoints that change state need ``Authorization: Bearer <token>`` when a token is set."""
    token = request.app.state.daemon.settings.token
    if token and not hmac.compare_digest(authorization or "", f"Bearer {token}"):
        raise HTTPException(401, "this endpoint needs 'Authorization: Bearer <token>' (SAMPLECACHE_TOKEN)",
                            headers={"WWW-Authenticate": "Bearer"})


DaemonDep = Annotated[Daemon, Depends(get_daemon)]
TokenDep = Depends(require_token)
