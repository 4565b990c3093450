"""A hostile local user: 8 senders, each streaming 50 MB PATCH /v1/config bodies with no token or a wrong one,
again as soon as the daemon closes the last, for a while. Its own process, so the test's probes of the daemon
do not wait on these threads.

    python body_flood.py URL SECONDS

Prints one JSON line: attempts, the first line of each reply (counted), the most bytes one attempt got out.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

MiB = 2**20
SIZE = 50 * MiB
PAUSE = 0.05  # seconds a sender waits between two attempts
SENDERS: list[tuple[list[str], bool]] = [([], False), (["Authorization: Bearer wrong"], False),
                                         (["Authorization: Bearer " + "x" * 43], True), ([], True)] * 2


def send_huge(url: str, headers: list[str], size: int, chunked: bool) -> dict[str, Any]:
    """Stream ``size`` bytes as a PATCH /v1/config body until the daemon stops taking them."""
    parts = urlsplit(url)
    s = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sent, reply = 0, ""
    try:
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
        head = "".join(f"{h}\r\n" for h in ["PATCH /v1/config HTTP/1.1", "Host: x", "Content-Type: application/json",
                                            framing, *headers])
        s.sendall((head + "\r\n").encode())
        block = b'{"max_bytes": "' + b"9" * (MiB - 16)
        try:
            while sent < size:
                piece = block[: min(MiB, size - sent)]
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
        except OSError:
            pass  # the daemon answered and closed: the rest is never read
        s.settimeout(10)
        try:
            reply = s.recv(200).split(b"\r\n", 1)[0].decode()
        except OSError as e:
            reply = f"closed ({e.__class__.__name__})"
    finally:
        s.close()
    return {"sent": sent, "reply": reply}


def main(url: str, seconds: float) -> None:
    results: list[dict[str, Any]] = []
    t0 = time.monotonic()

    def sender(headers: list[str], chunked: bool) -> None:
        while time.monotonic() - t0 < seconds:
            results.append(send_huge(url, headers, SIZE, chunked))
            time.sleep(PAUSE)

    threads = [threading.Thread(target=sender, args=a) for a in SENDERS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    replies: dict[str, int] = {}
    for r in results:
        key = r["reply"] if r["reply"].startswith("HTTP") else "closed"
        replies[key] = replies.get(key, 0) + 1
    print(json.dumps({"attempts": len(results), "seconds": time.monotonic() - t0, "replies": replies,
                      "most_sent": max((r["sent"] for r in results), default=0)}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
