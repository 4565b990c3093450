"""An HTTP/1.1 fault-injection proxy for tests: the daemon talks to S3 through it, and the test turns faults on
and off while it runs.

``FaultProxy(port, seed=0)`` listens on ``127.0.0.1:<proxy.port>`` and relays HTTP/1.1 to ``127.0.0.1:port``,
request by request (keep-alive: Content-Length and chunked bodies are parsed both ways, by http11.py; each
client connection has its own upstream connection). Knobs, changeable from any thread at any time:

- ``latency``: seconds added before each request is forwarded;
- ``reset_probability``: a response is cut after a random part of its body (of its head when it has no body)
  and the connection is reset (``SO_LINGER`` 0, so the client sees RST, not FIN);
- ``stall_probability`` / ``stall_seconds``: a response is held that long before its first byte;
- ``outage(seconds, mode)``: ``"reset"`` resets every live and new connection, ``"refuse"`` closes the listener
  (connections are refused), until the time is up;
- ``answer_error(pattern, seconds, status)``: requests whose object key matches the regex get a synthetic S3
  error (403 AccessDenied or 404 NoSuchKey, XML body) for that long.

Randomness comes from ``random.Random(seed)``, drawn once per request on the proxy's one thread: the same seed
and the same sequence of requests give the same faults. ``stats()`` counts requests, responses, resets, stalls,
synthetic errors and bytes each way; ``requests_for(pattern)`` lists the requests for matching keys. Use it as a
context manager; leaving it closes every connection and joins its thread.
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from http11 import PIECE, Head, body_pieces, read_head

STREAM_LIMIT = 1 << 20  # longest request/response head or chunk-size line
ERROR_CODES = {403: ("Forbidden", "AccessDenied", "Access Denied"),
               404: ("Not Found", "NoSuchKey", "The specified key does not exist.")}
COUNTERS = ("connections", "requests", "responses", "resets", "outage_resets", "stalls", "synthetic",
            "bytes_down", "bytes_up")


class _Reset(Exception):
    """The response was cut on purpose: reset the client connection."""


@dataclass
class ErrorRule:
    """Requests for object keys matching ``pattern`` get a synthetic S3 ``status`` until ``until`` (monotonic)."""

    pattern: re.Pattern[str]
    status: int
    until: float
    hits: int = 0
    first_hit: float | None = None  # monotonic time of the first request it answered

    @property
    def active(self) -> bool:
        return time.monotonic() < self.until


def reset(w: asyncio.StreamWriter) -> None:
    """Abort the connection with an RST (SO_LINGER on, timeout 0)."""
    sock = w.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    w.transport.abort()


def s3_error(status: int, path: str, request_id: str, with_body: bool = True) -> bytes:
    """A synthetic S3 error response (the XML S3 sends; no body for HEAD)."""
    phrase, code, message = ERROR_CODES[status]
    parts = path.lstrip("/").split("/", 1)
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f'<BucketName>{parts[0]}</BucketName><Key>{parts[1] if len(parts) > 1 else ""}</Key>'
            f'<Resource>{path}</Resource><RequestId>{request_id}</RequestId></Error>').encode()
    head = (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/xml\r\nContent-Length: "
            f"{len(body) if with_body else 0}\r\nx-amz-request-id: {request_id}\r\nServer: faultproxy\r\n\r\n")
    return head.encode() + (body if with_body else b"")


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", host: str = "127.0.0.1",
                 seed: int = 0) -> None:
        self.target_host, self.target_port, self.host = target_host, target_port, host
        self.port = 0
        self.latency = 0.0
        self.reset_probability = 0.0
        self.stall_probability = 0.0
        self.stall_seconds = 0.0
        self.rng = random.Random(seed)
        self.rules: list[ErrorRule] = []
        self.log: list[tuple[float, str, str, int]] = []  # (monotonic time, method, object key, status) per request
        self._outage_until = 0.0
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._error: BaseException | None = None

    # ----------------------------------------------------------------- knobs and counters
    def outage(self, seconds: float, mode: str = "reset") -> None:
        """Reset (``mode="reset"``) or refuse (``"refuse"``) every connection for ``seconds`` from now."""
        if mode not in ("reset", "refuse"):
            raise ValueError(f"mode must be 'reset' or 'refuse', not {mode!r}")
        self._outage_until = time.monotonic() + seconds
        self._call(self._begin_outage, seconds, mode)

    @property
    def in_outage(self) -> bool:
        return time.monotonic() < self._outage_until

    def answer_error(self, pattern: str, seconds: float, status: int = 403) -> ErrorRule:
        """For ``seconds``, requests whose object key (``bucket/key``, unquoted) matches ``pattern`` get a
        synthetic S3 error: 403 AccessDenied or 404 NoSuchKey."""
        if status not in ERROR_CODES:
            raise ValueError(f"status must be one of {sorted(ERROR_CODES)}")
        rule = ErrorRule(re.compile(pattern), status, time.monotonic() + seconds)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear_rules(self) -> None:
        with self._lock:
            self.rules.clear()

    def requests_for(self, pattern: str, since: float = 0.0) -> list[tuple[float, str, int]]:
        """(monotonic time, method, status) of the requests for keys matching ``pattern`` since ``since``; status
        0: reset in an outage. A response cut later by a reset still shows the status its head had."""
        rx = re.compile(pattern)
        with self._lock:
            return [(t, m, code) for t, m, key, code in self.log if t >= since and rx.search(key)]

    def _record(self, method: str, key: str, status: int) -> None:
        with self._lock:
            self.log.append((time.monotonic(), method, key, status))

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> "FaultProxy":
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="faultproxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if self._error is not None or not self.port:
            raise RuntimeError(f"fault proxy did not start: {self._error!r}")
        return self

    def close(self, timeout: float = 10.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._stop is not None and thread.is_alive():
            self._call(self._stop.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("fault proxy thread did not stop")

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Any, *args: Any) -> None:
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop already ended
                pass

    # ----------------------------------------------------------------- the loop
    def _run(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._main(ready))
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            ready.set()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=STREAM_LIMIT,
                                                  reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await self._listen()
        ready.set()
        try:
            await self._stop.wait()
        finally:
            if self._server is not None:
                self._server.close()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _begin_outage(self, seconds: float, mode: str) -> None:
        for w in list(self._clients):
            reset(w)
            self._count("outage_resets")
        if mode == "refuse" and self._server is not None:
            self._server.close()
            self._server = None
            task = asyncio.get_running_loop().create_task(self._reopen(seconds))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _reopen(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        while self._server is None:
            try:
                await self._listen()
            except OSError:
                await asyncio.sleep(0.1)

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._clients.add(cw)
        cw.transport.set_write_buffer_limits(0)  # drain() means "in the kernel": a cut then resets exactly there
        self._count("connections")
        conn = _Conn(cr, cw, (self.target_host, self.target_port))
        try:
            if self.in_outage:
                self._count("outage_resets")
                raise _Reset
            while (head := await read_head(cr)) is not None:
                if not await self._exchange(Head.parse(head), conn):
                    break
        except (_Reset, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
            reset(cw)
        except asyncio.CancelledError:
            pass
        finally:
            self._clients.discard(cw)
            conn.drop_upstream()
            cw.close()
            self._tasks.discard(task)

    async def _exchange(self, req: Head, conn: "_Conn") -> bool:
        """Relay one request and its response (or answer it here); returns whether the connection stays open."""
        cr, cw = conn.cr, conn.cw
        raw = req.raw
        if "100-continue" in req.headers.get("expect", "").lower():  # answered here; upstream never sees it
            raw = re.sub(rb"(?im)^expect:[^\r\n]*\r\n", b"", raw)
            cw.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = b"".join([piece async for piece in body_pieces(cr, *req.framing())])
        self._count("requests")
        self._count("bytes_up", len(req.raw) + len(body))
        method = req.first[0]
        path = urllib.parse.unquote(urllib.parse.urlsplit(req.first[1]).path).lstrip("/")
        draw_reset, draw_stall, draw_cut = self.rng.random(), self.rng.random(), self.rng.random()
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        if self.in_outage:
            self._count("outage_resets")
            self._record(method, path, 0)
            raise _Reset
        with self._lock:
            rule = next((r for r in self.rules if r.active and r.pattern.search(path)), None)
            if rule is not None:
                rule.hits += 1
                rule.first_hit = rule.first_hit or time.monotonic()
                request_id = f"FAULTPROXY{self._counts['requests']:08d}"
        if rule is not None:
            out = s3_error(rule.status, "/" + path, request_id, method != "HEAD")
            cw.write(out)
            await cw.drain()
            self._count("synthetic")
            self._record(method, path, rule.status)
            self._count("bytes_down", len(out))
            return not req.closes()
        head = await conn.forward(raw + body)
        resp = Head.parse(head)
        self._record(method, path, int(resp.first[1]))
        kind, length = resp.framing(method)
        if draw_stall < self.stall_probability and self.stall_seconds > 0:
            self._count("stalls")
            await asyncio.sleep(self.stall_seconds)
        cut = -1
        if draw_reset < self.reset_probability:  # where to cut: inside the body, else inside the head
            body_len = length if kind == "length" else (PIECE if kind in ("chunked", "eof") else 0)
            cut = len(head) + int(draw_cut * body_len) if body_len > 0 else int(draw_cut * len(head))
        sent = 0

        async def send(data: bytes) -> None:
            nonlocal sent
            n = len(data) if cut < 0 or cut >= sent + len(data) else cut - sent
            cw.write(data[:n])
            await cw.drain()
            sent += n
            self._count("bytes_down", n)
            if n < len(data):
                self._count("resets")
                raise _Reset

        assert conn.up is not None
        await send(head)
        held = b""  # with a cut ahead, the last piece is held back: a cut past the end falls before it
        async for piece in body_pieces(conn.up[0], kind, length):
            if held:
                await send(held)
            held = piece
            if cut < 0:
                await send(held)
                held = b""
        if held:  # the cut fell past the end (a short chunked body): cut before its last chunk
            self._count("resets")
            raise _Reset
        self._count("responses")
        if kind == "eof" or req.closes() or resp.closes():
            return False
        return True


class _Conn:
    """One client connection and its upstream connection (opened on the first forwarded request, kept alive)."""

    def __init__(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter, target: tuple[str, int]) -> None:
        self.cr, self.cw, self.target = cr, cw, target
        self.up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def forward(self, request: bytes) -> bytes:
        """Send ``request`` upstream and return the response head (interim 1xx responses skipped). A kept-alive
        upstream connection that the server closed meanwhile is replaced once."""
        for _ in (0, 1):
            fresh = self.up is None
            if self.up is None:
                self.up = await asyncio.open_connection(*self.target, limit=STREAM_LIMIT)
            try:
                self.up[1].write(request)
                await self.up[1].drain()
                head = await read_head(self.up[0])
                while head is not None and Head.parse(head).first[1].startswith("1"):
                    head = await read_head(self.up[0])
            except ConnectionError:
                head = None
            if head is not None:
                return head
            self.drop_upstream()
            if fresh:
                break
        raise ConnectionError("upstream closed the connection without a response")

    def drop_upstream(self) -> None:
        if self.up is not None:
            self.up[1].close()
            self.up = None
