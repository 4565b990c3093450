"""Whether the daemon can listen on its ``--host``/``--port``, asked before it opens the cache or lists the source:
a port in use is one line naming the port and the way out (``serve`` exits 3), not uvicorn's errno after a
slow start."""

from __future__ import annotations

import errno
import socket

PORT_IN_USE = 3  # serve's exit code when it cannot listen (uvicorn's own STARTUP_FAILURE is 3 as well)


def listen_problem(host: str, port: int) -> str | None:
    """None when ``host:port`` can be bound now (port 0: any free port, always); else why not, in one line."""
    if port == 0:
        return None
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot listen on --host {host!r}: {e.strerror}"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            # as asyncio's create_server binds: a port left in TIME_WAIT by a stopped daemon is free
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                return _why(e, host, port)
    return None


def _why(e: OSError, host: str, port: int) -> str:
    if e.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is in use by another process (another samplecache daemon? "
                f"`ss -ltnp 'sport = :{port}'` names it): stop it, or pass another --port / SAMPLECACHE_PORT")
    if e.errno == errno.EACCES:
        return f"port {port} on {host} needs privileges this process lacks: use a --port above 1023"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine"
    return f"cannot listen on {host}:{port}: {e.strerror or e}"
