"""This process's job on the daemon: its own epochs 0, 1, 2... whatever the daemon's global epoch count.

Every process of one run (ranks, DataLoader workers, hosts) uses the same job name
and ``run`` id, so they attach to one job and map each job epoch to the same daemon
epoch. The first request for a job epoch seals it from the sample resident then.
A new run under an existing name takes the job over and continues its epochs.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import quote

from samplecache.api.client import DEFAULT_DEADLINE, request_json


def new_run() -> str:
    return secrets.token_hex(8)


def job_name(job: str | None, run: str) -> str:
    """The job's name: the one given, else one made from the run (a new job per run)."""
    return job if job else f"run-{run}"


class JobClient:
    """Attaches to the job once and remembers which daemon epoch each job epoch reads."""

    def __init__(self, url: str, name: str, run: str, token: str | None = None, retries: int | None = None,
                 deadline: float = DEFAULT_DEADLINE) -> None:
        self.url, self.name, self.run, self.token, self.retries = url.rstrip("/"), name, run, token, retries
        self.deadline = deadline
        self.start: int | None = None  # the run's first job epoch, once attached
        self._daemon_epochs: dict[int, int] = {}

    def attach(self, resume: bool = False) -> int:
        """Start, join or take over the job; returns the run's first job epoch (0 for a new job, the next
        unread one for a job restarted by name). ``resume``: the job must exist (404 names the known ones)."""
        got = request_json(f"{self.url}/v1/jobs", "POST", self.token,
                           {"name": self.name, "run": self.run, "resume": bool(resume)}, retries=self.retries,
                           deadline=self.deadline, what=f"attaching to job {self.name!r}")
        self.start = int(got["start_epoch"])
        return self.start

    def record_mixture(self, job_epoch: int, record: dict[str, Any]) -> None:
        """Tell the daemon the mixture ``job_epoch`` reads and its samples per source (GET /v1/jobs/{name})."""
        request_json(f"{self.url}/v1/jobs/{quote(self.name)}/epochs/{int(job_epoch)}/mixture?run={self.run}",
                     "PUT", self.token, record, retries=self.retries, deadline=self.deadline,
                     what=f"recording job {self.name!r} epoch {int(job_epoch)}'s mixture")

    def daemon_epoch(self, job_epoch: int, min_samples: int = 1, wait: float = 30.0,
                     replay: int | None = None) -> int:
        """The daemon epoch that ``job_epoch`` reads (sealed now if the job has not read it before; with
        ``replay``, that sealed daemon epoch)."""
        got = self._daemon_epochs.get(job_epoch)
        if got is None or (replay is not None and replay != got):
            url = (f"{self.url}/v1/jobs/{quote(self.name)}/epochs/{int(job_epoch)}?run={self.run}"
                   f"&min_samples={int(min_samples)}&timeout={wait}")
            if replay is not None:
                url += f"&daemon_epoch={int(replay)}"
            reply: dict[str, Any] = request_json(
                url, "POST", self.token, {}, wait=wait, retries=self.retries, deadline=self.deadline,
                what=f"mapping job {self.name!r} epoch {int(job_epoch)} to a daemon epoch")
            got = self._daemon_epochs[job_epoch] = int(reply["daemon_epoch"])
        return got
