"""The named sources of one daemon: each with its own remote, discovery and scheduler (its own schema, quarantine,
coverage and failures), sharing the samplers, the LMDB writer and the budget, of which it has its share."""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from samplecache_service.config.redact import redact
from samplecache_service.errors import Conflict
from samplecache_service.remote.discovery import Discovery
from samplecache_service.remote.stores import FsspecRemote
from samplecache_service.sampling.scheduler import Scheduler
from samplecache_service.store.budget import ShareOf

log = logging.getLogger("samplecache.daemon")


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
        """Whether a new epoch may name this source's shards (``not_ready``)."""
        return self.not_ready() is None

    def not_ready(self) -> str | None:
        """Why a new epoch cannot name this source's shards yet: its schema is not known (discovery has not listed
        it); or, on a warm cache of a table or with a filter, this run has not listed it yet: until it has, the
        files that left the table (or the filter) while the daemon was stopped are not known, and would be
        served."""
        d, s = self.discovery, self.scheduler
        if d is not None and d.refused:
            return f"the source's table cannot be served as it is now: {d.refused}"
        if s.schema() is not None and not (d is not None and d.listed_at is None and d.prunes()):
            return None
        return f"the source is not discovered yet: {redact(s.last_error) if s.last_error else 'discovering'}"

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


def changed_remotes(old: dict[str, Source], named: dict[str, tuple[str, float]],
                    remote_for: Callable[[str], FsspecRemote], say_url: bool = True,
                    filters: dict[str, str | None] | None = None) -> dict[str, FsspecRemote]:
    """Each source's remote once the sources are ``named`` (name -> (URL, fraction)): a kept source's own, a new
    one's made by ``remote_for``. Raises errors.Conflict (nothing changed) for a kept name given another URL, no
    source at all, a store that cannot be opened, or sources one within another (``filters``: sources of one
    root, each with a filter of its own, are filters of one table, not one within another). ``say_url`` False: the
    errors name no URL (a request's answer never echoes what it sent; the log has it)."""
    moved = [n for n in named if n in old and old[n].remote.url != named[n][0]]
    if moved:
        raise Conflict(f"source(s) {moved} would change URL: a source's URL is fixed while the daemon runs (its "
                       f"cached sample is of that URL); add the new URL under another name")
    if not named:
        raise Conflict("the sources would be none: keep at least one")
    remotes = {}
    for n, (url, _) in named.items():
        try:
            remotes[n] = old[n].remote if n in old else remote_for(url)
        except Exception as e:  # an unknown protocol, its package missing, bad options: said, nothing changed
            log.warning("source %s: cannot open %s: %s: %s", n, redact(url), type(e).__name__, redact(str(e)),
                        extra={"event": "source_failed"})
            kind = type(e).__name__
            what = f"{redact(url)!r}: {kind}: {redact(str(e))}" if say_url else f"its store ({kind})"
            raise Conflict(f"source {n!r}: cannot open {what}") from None
    both = overlapping({n: r.root for n, r in remotes.items()}, filters or {})
    if both:
        raise Conflict("sources " + ", ".join(f"{a!r} and {b!r}" for a, b in both) + " lie one within the other: "
                       "their files cannot be told apart; give each its own prefix, or (one table) each its own "
                       "filter")
    return remotes


def overlapping(roots: dict[str, Any], filters: dict[str, str | None] | None = None) -> list[tuple[str, str]]:
    """Pairs of sources whose roots lie one within the other: their files could not be told apart. Two sources of
    one root whose filters differ (each has one) are filters of one table: each owns the files inside its filter,
    and lists, samples and evicts its own."""
    named = {n: re.split(r"[*?\[]", str(r))[0].rstrip("/") for n, r in roots.items()}
    f = filters or {}

    def filtered(a: str, b: str) -> bool:
        return bool(f.get(a)) and bool(f.get(b)) and f.get(a) != f.get(b)
    return [(a, b) for a in named for b in named if a < b and (
        named[a] == named[b] and not filtered(a, b) or named[a].startswith(named[b] + "/")
        or named[b].startswith(named[a] + "/"))]
