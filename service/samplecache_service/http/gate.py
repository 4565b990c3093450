"""The gate every HTTP request passes before any route: the token first, then the body's size.

A pure ASGI middleware (no ``BaseHTTPMiddleware``: that one reads bodies into memory). For a method that
can change state it checks ``Authorization: Bearer <token>`` before a single body byte is read: a wrong or
missing token is a 401 (its detail says which) and the body is never received. A body announced larger than
``max_body_bytes`` (``Content-Length``) is a 413 at once; a body without a length (chunked) is received up to the
limit and refused as soon as it passes it. Replies are JSON ``{"detail": ...}``, as every other error is.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, MutableMapping

from samplecache_service.http.auth import token_problem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # every other method needs the token


async def problem(send: Send, status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Send a JSON ``{"detail": ...}`` reply that closes the connection (its body may be unread)."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


class RequestGate:
    """``token`` (None: no auth) is checked for unsafe methods; bodies over ``max_body_bytes`` are refused."""

    def __init__(self, app: ASGIApp, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.token = token.encode("utf-8") if token is not None else None
        self.limit = int(max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.token is not None and scope["method"] not in SAFE_METHODS:
            refused = token_problem(_header(scope, b"authorization"), self.token)
            if refused is not None:
                await problem(send, 401, refused, ((b"www-authenticate", b"Bearer"),))
                return
        length = _header(scope, b"content-length")
        too_big = f"the request body is larger than the daemon accepts ({self.limit} bytes, --max-body-bytes)"
        if length is not None:
            if not length.strip().isdigit():
                await problem(send, 400, "the Content-Length header is not a number")
                return
            if int(length) > self.limit:
                await problem(send, 413, too_big)
                return
            await self.app(scope, receive, send)  # the server reads no more than Content-Length says
            return
        if _header(scope, b"transfer-encoding") is None:
            await self.app(scope, receive, send)  # no body at all
            return
        received = await self._receive_at_most(receive)
        if received is None:
            await problem(send, 413, too_big)
            return
        await self.app(scope, _replay(received, receive), send)

    async def _receive_at_most(self, receive: Receive) -> list[Message] | None:
        """The body's messages while they stay within the limit; None once they pass it."""
        got: list[Message] = []
        size = 0
        while True:
            message = await receive()
            got.append(message)
            if message["type"] != "http.request":
                return got  # a disconnect: the app sees it
            size += len(message.get("body", b""))
            if size > self.limit:
                return None
            if not message.get("more_body", False):
                return got


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that hands out ``messages`` first, then whatever the server sends next."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
