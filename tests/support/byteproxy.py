"""A byte-counting TCP relay on loopback for tests: asyncio in one background thread.

``ByteProxy(port)`` listens on ``127.0.0.1:<proxy.port>`` and relays every connection to ``127.0.0.1:port``,
counting the bytes in each direction: ``downloaded`` (server -> client) and ``uploaded`` (client -> server).
Use it as a context manager; leaving it closes the listener and every relayed connection and joins the thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class ByteProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", host: str = "127.0.0.1") -> None:
        self.target_host, self.target_port, self.host = target_host, target_port, host
        self.port = 0
        self.connections = 0  # accepted since start
        self._down = 0
        self._up = 0
        self._count_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._error: BaseException | None = None

    # ----------------------------------------------------------------- counters
    @property
    def downloaded(self) -> int:
        with self._count_lock:
            return self._down

    @property
    def uploaded(self) -> int:
        with self._count_lock:
            return self._up

    def reset(self) -> int:
        """Zero the counters; returns the bytes downloaded before."""
        with self._count_lock:
            down, self._down, self._up = self._down, 0, 0
            return down

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ----------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 10.0) -> "ByteProxy":
        if self._thread is not None:
            raise RuntimeError("already started")
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=f"byteproxy->{self.target_port}",
                                        daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or self._error is not None:
            self.close()
            raise RuntimeError(f"byte proxy did not start: {self._error!r}")
        return self

    def close(self, timeout: float = 10.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and thread.is_alive():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop already ended
                pass
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("byte proxy thread did not stop")

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "ByteProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- the loop
    def _run(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._main(ready))
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            ready.set()

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, self.host, 0)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        server_w: asyncio.StreamWriter | None = None
        try:
            try:
                server_r, server_w = await asyncio.open_connection(self.target_host, self.target_port)
            except OSError:
                return
            await asyncio.gather(self._pipe(client_r, server_w, down=False),
                                 self._pipe(server_r, client_w, down=True))
        except (asyncio.CancelledError, OSError):
            pass
        finally:
            for w in (client_w, server_w):
                if w is not None:
                    w.close()
            for w in (client_w, server_w):
                if w is not None:
                    try:
                        await asyncio.wait_for(w.wait_closed(), 1.0)
                    except (OSError, asyncio.TimeoutError, asyncio.CancelledError):
                        pass
            self._tasks.discard(task)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, down: bool) -> None:
        try:
            while True:
                data = await r.read(1 << 16)
                if not data:
                    break
                with self._count_lock:
                    if down:
                        self._down += len(data)
                    else:
                        self._up += len(data)
                w.write(data)
                await w.drain()
            if w.can_write_eof():
                w.write_eof()  # half-close: the other direction may still carry a reply
        except OSError:
            w.close()  # the peer went away: end the other direction too
