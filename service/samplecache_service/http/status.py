"""The status snapshot: what ``/v1/status`` (and ``samplecache status``) shows of a running daemon."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from samplecache.version import __version__
from samplecache_service.config.redact import redact
from samplecache_service.http.auth import auth_status
from samplecache_service.http.models import EpochSummary, SourceStatus, Status

EPOCHS_SHOWN = 20  # the latest epochs' summaries in /v1/status
LEASES_SHOWN = 50  # the newest live leases in /v1/status (the rest are counted; GET /v1/jobs/{name} lists a job's)

if TYPE_CHECKING:
    from samplecache_service.daemon import Daemon


def ingest_rate(d: "Daemon", window: float = 60.0) -> dict[str, float]:
    now = time.time()
    recent = [(t, r, b) for s in list(d.sources.values()) for t, r, b in list(s.scheduler.ingests) if now - t <= window]
    span = min(window, max(1e-9, now - d.started))
    return {"samples_per_s": sum(r for _, r, _ in recent) / span,
            "bytes_per_s": sum(b for _, _, b in recent) / span}


def lmdb_usage(d: "Daemon") -> dict[str, int]:
    """What the LMDB file really takes: its size on disk and the pages in use (freed pages are reused)."""
    with d.gate.using() as env:
        info, stat = env.info(), env.stat()
    data = d.settings.lmdb_path / "data.mdb"
    try:
        size = data.stat().st_size
    except OSError:  # the cache dir is gone (that shows in /healthz): the status still answers
        size = 0
    return {"file_bytes": size,
            "used_bytes": (info["last_pgno"] + 1) * stat["psize"], "map_size": info["map_size"]}


def sampling_of(d: "Daemon") -> tuple[str, str | None]:
    """The samplers' state and reason for the daemon as a whole: with several sources, ``sampling`` while any
    source samples (else the first source's state), and the reason names each source that does not sample."""
    crash = d.supervisor.crash_loop()
    srcs = list(d.sources.items())
    if len(srcs) <= 1:
        return d.scheduler.state(), crash or d.paused_reason
    states = {n: src.scheduler.state() for n, src in srcs}
    state = "sampling" if "sampling" in states.values() else states[srcs[0][0]]
    reasons = [f"{n}: {redact(src.scheduler.paused_reason)}" for n, src in srcs if src.scheduler.paused_reason]
    return state, crash or ("; ".join(reasons) or None)


def last_error_of(d: "Daemon") -> str | None:
    """The last remote error: the source's own with one source; with several, each source's that has one, named."""
    srcs = list(d.sources.items())
    if len(srcs) <= 1:
        return d.last_error
    errors = [f"{n}: {redact(src.scheduler.last_error)}" for n, src in srcs if src.scheduler.last_error]
    return "; ".join(errors) or None


def status_of(d: "Daemon") -> Status:
    summaries = d.catalog.summaries()
    epochs = [EpochSummary(epoch=e, **summaries[e]) for e in sorted(summaries)[-EPOCHS_SHOWN:]]
    quarantined = [{"path": q["path"], "reason": q["reason"], "at": q["at"]} for q in d.quarantined()]
    eps = d.catalog.epochs()
    shown, live, by_job = d.leases.summary(LEASES_SHOWN)
    pacer = d.traffic.pacer
    state, reason = sampling_of(d)
    return Status(
        version=__version__, uptime_s=time.time() - d.started, source=d.source_shown,
        cache_dir=str(d.settings.cache_dir.resolve()), bytes=d.catalog.resident_bytes,
        max_bytes=d.max_bytes, samples=d.catalog.resident_rows, shards=d.catalog.shard_count(),
        map_size=d.map_size, disk_free=d.disk.free_or_zero(),
        epochs_sealed=len(eps), last_epoch=eps[-1] if eps else -1, epochs=epochs,
        sampler={"state": state, "reason": reason,
                 "processes": d.supervisor.size, "in_flight": d.supervisor.pending(),
                 "restarts": d.supervisor.restarts, "start_failures": d.supervisor.start_failures},
        ingest={**ingest_rate(d), "commits": d.writer.commits},
        remote={"bytes_read": d.traffic.total(), "bytes_since_last_epoch": d.traffic.since_seal(),
                **d.traffic.amplification()},
        pacing={"mode": pacer.mode, "replace_per_epoch": pacer.replace_per_epoch, "max_ingest_rate": pacer.max_rate,
                "allowance_bytes": int(pacer.allowance), "reason": pacer.reason},
        remote_errors=d.remote_errors, last_error=last_error_of(d), quarantined=quarantined,
        skipped_columns=d.discovery.skipped if d.discovery else {},
        files=d.discovery.listing() if d.discovery else None,
        table=d.discovery.table_info() if d.discovery else None,
        coverage=d.scheduler.coverage(), settings={**d.settings.public(), **d.runtime_config()},
        config=d.config_state or {}, auth=auth_status(d.settings),
        evictions=d.evicted_shards, eviction_policy=d.policy,
        leases=[{k: v for k, v in l.to_json().items() if k != "run"} for l in shown],
        leases_live=live, leases_by_job=by_job,
        health={"problems": d.health.problems(), "threads": d.health.snapshot(),
                "unit_failures": dict(d.scheduler.unit_failures), "units_given_up": d.scheduler.units_given_up,
                "failed_events": d.scheduler.inbox.failed_events},
        jobs=d.jobs.active(), pinned_epochs=sorted(d.epochs.pinned_epochs()), lmdb=lmdb_usage(d),
        sources=sources_of(d))


def sources_of(d: "Daemon") -> list[SourceStatus]:
    """Each named source's status (``GET /v1/sources``, and ``sources`` in ``/v1/status``)."""
    files = d.catalog.files()
    out = []
    for name, src in d.sources.items():
        s, held = src.scheduler, d.catalog.resident(name)
        quarantined = sum(1 for p, i in files.items() if i.quarantined and s.owns(p))
        out.append(SourceStatus(
            name=name, url=src.shown, share=src.share.fraction, max_bytes=src.share.max_bytes, bytes=held.bytes,
            samples=held.rows, shards=held.shards, state=s.state(),
            reason=redact(s.paused_reason) if s.paused_reason else None, problem=redact(src.problem() or "") or None,
            coverage=s.coverage(), remote_bytes=src.remote.bytes_read if src.remote is not None else 0,
            remote_errors=s.remote_errors, last_error=redact(s.last_error) if s.last_error else None,
            allowance_bytes=int(d.traffic.pacer.allowances.get(name, 0.0)), quarantined=quarantined,
            skipped_columns=src.discovery.skipped if src.discovery else {},
            filter=src.discovery.filter.text if src.discovery and src.discovery.filter else None,
            ready=src.ready()))
    return out
