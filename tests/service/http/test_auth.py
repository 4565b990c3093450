"""The 401 says why a mutation was refused (no token, not a bearer header, a wrong token) and never shows a token:
both the gate (``gate.py``, before the body is read) and the routes' own check (``deps.py``, an app without the
gate) give the same details."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from samplecache_service.http.auth import NO_TOKEN, NOT_BEARER, WRONG_TOKEN, token_problem
from samplecache_service.http.deps import TokenDep
from samplecache_service.http.gate import RequestGate

TOKEN = "s3cret-T0ken-of-the-daemon"
CASES = [  # (Authorization header or None, the 401's detail; None: allowed)
    (None, NO_TOKEN), (b"", NO_TOKEN), (b"Bearer", NO_TOKEN), (b"Bearer   ", NO_TOKEN),
    (b"Basic " + TOKEN.encode(), NOT_BEARER), (TOKEN.encode(), NOT_BEARER),
    (b"Bearer nope-not-it", WRONG_TOKEN), (b"Bearer " + TOKEN.encode() + b"x", WRONG_TOKEN),
    (b"Bearer \xc3\xa9t\xc3\xa9", WRONG_TOKEN),
    (b"Bearer " + TOKEN.encode(), None), (b"bearer  " + TOKEN.encode() + b" ", None),
]


@pytest.mark.parametrize("header,why", CASES)
def test_token_problem_says_which(header: bytes | None, why: str | None) -> None:
    assert token_problem(header, TOKEN.encode()) == why


def test_the_three_details_differ_and_say_where_the_token_is() -> None:
    assert len({NO_TOKEN, NOT_BEARER, WRONG_TOKEN}) == 3
    for detail in (NO_TOKEN, NOT_BEARER, WRONG_TOKEN):
        assert "token" in detail and "auth.token_file" in detail


def _gate_reply(header: bytes | None) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    headers = [] if header is None else [(b"authorization", header)]
    scope = {"type": "http", "method": "POST", "path": "/v1/samplers/pause", "headers": headers}
    asyncio.run(RequestGate(app, TOKEN, 1024)(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body) if body else {}


@pytest.mark.parametrize("header,why", CASES)
def test_the_gate_answers_with_the_reason(header: bytes | None, why: str | None) -> None:
    status, body = _gate_reply(header)
    assert status == (204 if why is None else 401)
    if why is not None:
        assert body == {"detail": why}
        assert TOKEN not in body["detail"] and "nope" not in body["detail"]


@pytest.mark.parametrize("header,why", [c for c in CASES if c[0] is None or c[0].isascii()])
def test_routes_without_the_gate_answer_with_the_reason(header: bytes | None, why: str | None) -> None:
    app = FastAPI()
    app.state.token = TOKEN

    @app.post("/mutate", dependencies=[TokenDep], status_code=204)
    def mutate() -> None:
        return None

    with TestClient(app) as client:
        r = client.post("/mutate", headers={} if header is None else {"Authorization": header.decode()})
    assert r.status_code == (204 if why is None else 401), r.text
    if why is not None:
        assert r.json() == {"detail": why} and r.headers["www-authenticate"] == "Bearer"
