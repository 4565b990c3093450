"""The named sources of one daemon: each with its own remote, discovery and scheduler (its own schema, quarantine,
coverage and failures), sharing the samplers, the LMDB writer and the budget, of which it has its share."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.stores import FsspecRemote
from samplecache_service.sampling.scheduler import Scheduler
from samplecache_service.store.budget import ShareOf


@dataclass
class Source:
    name: str
    shown: str  # the URL, credentials masked
    share: ShareOf
    remote: FsspecRemote
    discovery: Discovery | None
    scheduler: Scheduler
    stopping: threading.Event = field(default_factory=threading.Event)  # set: its scheduler's thread ends

    def ready(self) -> bool:
        """Whether a new epoch may name this source's shards: its schema is known, and on a warm cache of a table
        (or with a filter) this run has listed it (until then files that left it while the daemon was stopped
        are not known)."""
        d = self.discovery
        if d is None or d.refused or self.scheduler.schema() is None:
            return False
        return not (d.listed_at is None and d.prunes())

    def problem(self) -> str | None:
        """Why this source does not sample now, when something is wrong (not when it is merely full or paced)."""
        s = self.scheduler
        state = s.state()
        if state in ("remote error", "crash loop"):
            return f"{state}: {s.last_error or s.supervisor.crash_loop()}"
        cov = s.coverage()
        if s.planner is not None and cov and cov.get("units") and cov.get("units_left_out", 0) >= cov["units"]:
            return "every file of the source is quarantined"
        return None


def owner(remote: FsspecRemote) -> Callable[[str], bool]:
    """Whether a listed path is one of ``remote``'s files: it lies under its root (a glob: under its fixed part)."""
    prefix = re.split(r"[*?\[]", str(remote.root))[0]
    return lambda path: path.startswith(prefix)


def overlapping(roots: dict[str, Any]) -> list[tuple[str, str]]:
    """Pairs of sources whose roots lie one within the other: their files could not be told apart."""
    named = {n: re.split(r"[*?\[]", str(r))[0].rstrip("/") for n, r in roots.items()}
    return [(a, b) for a in named for b in named if a < b and (
        named[a] == named[b] or named[a].startswith(named[b] + "/") or named[b].startswith(named[a] + "/"))]
