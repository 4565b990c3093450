"""A lease on an epoch, held while a process reads it: taken when reading starts, heartbeated, released at the end.

While the lease lives the daemon never evicts a shard of the epoch. A process
that dies stops heartbeating and its lease expires after its TTL. At an epoch's
end the release is sent from a thread and waited for briefly (``release(wait=)``):
a daemon that does not answer cannot hold the training loop at the boundary, and
the lease expires by itself anyway.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from multiprocessing import util as mp_util
from typing import Any
from urllib.parse import quote

from samplecache.api.client import DEFAULT_DEADLINE, DaemonError, request_json

log = logging.getLogger("samplecache.lease")
RELEASE_DEADLINE = 10.0  # seconds a release may take, all attempts together (at most the call's deadline)


class LeaseKeeper:
    """A lease on daemon epoch ``epoch``; with ``job``, ``run`` and ``job_epoch`` it counts for that job.
    Set ``read`` as samples are read: the heartbeats and the release report it."""

    def __init__(self, url: str, epoch: int, token: str | None = None, ttl: float | None = None,
                 holder: str | None = None, job: str | None = None, run: str | None = None,
                 job_epoch: int | None = None, deadline: float = DEFAULT_DEADLINE) -> None:
        self.url, self.epoch, self.token, self.deadline = url.rstrip("/"), epoch, token, deadline
        self.read = 0
        self.read_sources: dict[str, int] | None = None  # of ``read``, per source (a mixture's reader)
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
        self._releasing: threading.Thread | None = None  # a release sent in the background, if any
        self._thread.start()
        # a trainer, or a DataLoader worker, that exits normally frees its leases at once (workers leave through
        # os._exit, which skips atexit but runs multiprocessing's finalizers)
        self._at_exit = mp_util.Finalize(None, self.release, exitpriority=10)

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                request_json(f"{self.url}/v1/epochs/{self.epoch}/leases/{self.id}/heartbeat", "POST",
                             self.token, self._report(), deadline=min(self.deadline, self.ttl / 3),
                             retries=1, what=f"renewing the lease on daemon epoch {self.epoch}")
            except DaemonError as e:
                if self._stop.is_set():
                    return  # released meanwhile: nothing to say
                if e.status in (404, 409, 410):
                    self.lost = str(e)
                    log.warning("lost the lease on epoch %d: %s", self.epoch, e)
                    return
                log.warning("lease heartbeat failed (will retry): %s", e)

    def _report(self) -> dict[str, Any]:
        """What a heartbeat says of the reading: samples read, and per source for a mixture."""
        got: dict[str, Any] = {"read": self.read}
        if self.read_sources:
            got["read_sources"] = dict(self.read_sources)
        return got

    def alive(self) -> bool:
        """Heartbeating in this process (a copy inherited across fork is not)."""
        return self._thread.is_alive() and not self._stop.is_set()

    def release(self, wait: float | None = None) -> None:
        """Release the lease and stop heartbeating (in the process that took it; a copy inherited across fork
        only stops). ``wait`` None: until the daemon answered (or the release's deadline passed) and the threads
        ended; a number: the release goes on in a thread, waited for at most that long (an epoch's end)."""
        if self._stop.is_set():
            if wait is None:
                self._join()  # a release sent in the background earlier: done by now
            return
        self._stop.set()
        self._at_exit.cancel()
        if self._pid != os.getpid():
            return
        if wait is None:
            self._send_release()
            self._join()
            return
        self._releasing = threading.Thread(target=self._send_release, daemon=True,
                                           name=self._thread.name.replace("-lease-", "-release-", 1))
        self._releasing.start()
        self._releasing.join(wait)

    def releasing(self) -> bool:
        """A release sent in the background is still waiting for the daemon."""
        return self._releasing is not None and self._releasing.is_alive()

    def _send_release(self) -> None:
        try:
            per = f"&read_sources={quote(json.dumps(self.read_sources))}" if self.read_sources else ""
            request_json(f"{self.url}/v1/epochs/{self.epoch}/leases/{self.id}?read={int(self.read)}{per}", "DELETE",
                         self.token, deadline=min(self.deadline, RELEASE_DEADLINE), retries=1,
                         what=f"releasing the lease on daemon epoch {self.epoch}")
        except DaemonError as e:  # it will expire by itself
            log.debug("lease release failed: %s", e)

    def _join(self) -> None:
        """Wait (bounded) for the heartbeat thread and a release sent in the background (this process's)."""
        if self._pid != os.getpid():
            return
        for t in (self._thread, self._releasing):
            if t is not None and t is not threading.current_thread() and t.ident is not None:
                t.join(timeout=RELEASE_DEADLINE if t is self._releasing else 5)
