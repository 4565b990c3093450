"""HTTP/1.1 message framing for test proxies: a message head, and a body read piece by piece whatever its framing
(Content-Length, chunked with trailers, or up to the end of the connection), raw bytes kept as they came."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator

PIECE = 1 << 16


@dataclass
class Head:
    """The head of a request or response: start line fields and headers (names lower-cased)."""

    raw: bytes
    first: list[str]
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: bytes) -> "Head":
        lines = raw.decode("latin-1").split("\r\n")
        msg = cls(raw, lines[0].split(" ", 2))
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                msg.headers[name.strip().lower()] = value.strip()
        return msg

    def framing(self, request_method: str | None = None) -> tuple[str, int]:
        """('none'|'length'|'chunked'|'eof', length) of the body that follows this head."""
        if request_method is not None:  # a response
            code = int(self.first[1])
            if request_method == "HEAD" or code < 200 or code in (204, 304):
                return "none", 0
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            return "chunked", -1
        if "content-length" in self.headers:
            return "length", int(self.headers["content-length"])
        return ("none", 0) if request_method is None else ("eof", -1)

    def closes(self) -> bool:
        return "close" in self.headers.get("connection", "").lower()


async def read_head(r: asyncio.StreamReader) -> bytes | None:
    """The next message head, up to and with its empty line; None at a clean end of the connection."""
    try:
        return await r.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise ConnectionError("connection closed inside a message head") from None
        return None


async def body_pieces(r: asyncio.StreamReader, kind: str, length: int) -> AsyncIterator[bytes]:
    """The raw bytes of a body (chunk framing included), piece by piece."""
    if kind == "length":
        while length > 0:
            piece = await r.readexactly(min(length, PIECE))
            length -= len(piece)
            yield piece
    elif kind == "chunked":
        while True:
            line = await r.readuntil(b"\r\n")
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:  # the last chunk and its trailers, up to the empty line: one piece
                while not line.endswith(b"\r\n\r\n"):
                    line += await r.readuntil(b"\r\n")
                yield line
                return
            yield line
            async for piece in body_pieces(r, "length", size + 2):
                yield piece
    elif kind == "eof":
        while piece := await r.read(PIECE):
            yield piece
