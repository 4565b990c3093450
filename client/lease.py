"""A reader's lease on an epoch: taken when reading starts, heartbeated, released at the end.

While the lease lives the daemon never evicts a shard of the epoch. A reader
that dies stops heartbeating and its lease expires after its TTL.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
from typing import Any

from samplecache.daemon_api import DaemonError, request_json

log = logging.getLogger("samplecache.lease")


class LeaseKeeper:
    def __init__(self, url: str, epoch: int, token: str | None = None, ttl: float | None = None,
                 holder: str | None = None) -> None:
        self.url, self.epoch, self.token = url.rstrip("/"), epoch, token
        body: dict[str, Any] = {"holder": holder or f"{socket.gethostname()} pid {os.getpid()}"}
        if ttl is not None:
            body["ttl"] = ttl
        got = request_json(f"{self.url}/v1/epochs/{epoch}/leases", "POST", token, body)
        self.id: str = got["id"]
        self.ttl: float = float(got["ttl"])
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"samplecache-lease-{epoch}", daemon=True)
        self._thread.start()
        atexit.register(self.release)  # a trainer that exits normally frees its leases at once

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                request_json(f"{self.url}/v1/epochs/{self.epoch}/leases/{self.id}/heartbeat", "POST",
                             self.token, {}, timeout=self.ttl / 3, retries=1)
            except DaemonError as e:
                if " 404" in str(e) or " 410" in str(e):
                    self.lost = str(e)
                    log.warning("lost the lease on epoch %d: %s", self.epoch, e)
                    return
                log.warning("lease heartbeat failed (will retry): %s", e)

    def alive(self) -> bool:
        """Heartbeating in this process (a copy inherited across fork is not)."""
        return self._thread.is_alive() and not self._stop.is_set()

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        atexit.unregister(self.release)
        try:
            request_json(f"{self.url}/v1/epochs/{self.epoch}/leases/{self.id}", "DELETE", self.token,
                         timeout=10, retries=1)
        except DaemonError as e:  # it will expire by itself
            log.debug("lease release failed: %s", e)
