"""A lease on an epoch, held while a process reads it: taken when reading starts, heartbeated, released at the end.

While the lease lives the daemon never evicts a shard of the epoch. A process
that dies stops heartbeating and its lease expires after its TTL.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from multiprocessing import util as mp_util
from typing import Any

from samplecache.api.client import DEFAULT_DEADLINE, DaemonError, request_json

log = logging.getLogger("samplecache.lease")


class LeaseKeeper:
    """A lease on daemon epoch ``epoch``; with ``job``, ``run`` and ``job_epoch`` it counts for that job.
    Set ``read`` as samples are read: the heartbeats and the release report it."""

    def __init__(self, url: str, epoch: int, token: str | None = None, ttl: float | None = None,
                 holder: str | None = None, job: str | None = None, run: str | None = None,
                 job_epoch: int | None = None, deadline: float = DEFAULT_DEADLINE) -> None:
        self.url, self.epoch, self.token, self.deadline = url.rstrip("/"), epoch, token, deadline
        self.read = 0
        body: dict[str, Any] = {"holder": holder or f"{socket.gethostname()} pid {os.getpid()}"}
        if ttl is not None:
            body["ttl"] = ttl
        if job is not None:
            body.update(job=job, run=run, job_epoch=job_epoch)
        got = request_json(f"{self.url}/v1/epochs/{epoch}/leases", "POST", token, body, deadline=deadline,
                           what=f"taking a lease on daemon epoch {epoch}")
        self.id: str = got["id"]
        self.ttl: float = float(got["ttl"])
        self.lost: str | None = None
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"samplecache-lease-{job or ''}-{epoch}",
                                        daemon=True)
        self._thread.start()
        # a trainer, or a DataLoader worker, that exits normally frees its leases at once (workers leave through
        # os._exit, which skips atexit but runs multiprocessing's finalizers)
        self._at_exit = mp_util.Finalize(None, self.release, exitpriority=10)

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                request_json(f"{self.url}/v1/epochs/{self.epoch}/leases/{self.id}/heartbeat", "POST",
                             self.token, {"read": self.read}, deadline=min(self.deadline, self.ttl / 3),
                             retries=1, what=f"renewing the lease on daemon epoch {self.epoch}")
            except DaemonError as e:
                if self._stop.is_set():
                    return  # released meanwhile: nothing to say
                if e.status in (404, 409, 410):
                    self.lost = str(e)
                    log.warning("lost the lease on epoch %d: %s", self.epoch, e)
                    return
                log.warning("lease heartbeat failed (will retry): %s", e)

    def alive(self) -> bool:
        """Heartbeating in this process (a copy inherited across fork is not)."""
        return self._thread.is_alive() and not self._stop.is_set()

    def release(self) -> None:
        """Release the lease now and stop heartbeating (in the process that took it; a copy inherited
        across fork only stops)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._at_exit.cancel()
        if self._pid != os.getpid():
            return
        try:
            request_json(f"{self.url}/v1/epochs/{self.epoch}/leases/{self.id}?read={int(self.read)}", "DELETE",
                         self.token, deadline=min(self.deadline, 10.0), retries=1,
                         what=f"releasing the lease on daemon epoch {self.epoch}")
        except DaemonError as e:  # it will expire by itself
            log.debug("lease release failed: %s", e)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
