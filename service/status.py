"""The status snapshot: what ``/v1/status`` (and ``samplecache status``) shows of a running daemon."""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING

from samplecache import __version__
from samplecache.service.models import EpochSummary, Status

if TYPE_CHECKING:
    from samplecache.service.daemon import Daemon


def ingest_rate(d: "Daemon", window: float = 60.0) -> dict[str, float]:
    now = time.time()
    recent = [(t, r, b) for t, r, b in list(d._ingests) if now - t <= window]
    span = min(window, max(1e-9, now - d.started))
    return {"samples_per_s": sum(r for _, r, _ in recent) / span,
            "bytes_per_s": sum(b for _, _, b in recent) / span}


def sampler_state(d: "Daemon") -> str:
    if d.planner is None:
        return "discovering" if d.last_error is None else "remote error"
    return "paused" if d.paused_reason else "sampling"


def lmdb_usage(d: "Daemon") -> dict[str, int]:
    """What the LMDB file really takes: its size on disk and the pages in use (freed pages are reused)."""
    info, stat = d.env.info(), d.env.stat()
    data = d.settings.lmdb_path / "data.mdb"
    return {"file_bytes": data.stat().st_size if data.exists() else 0,
            "used_bytes": (info["last_pgno"] + 1) * stat["psize"], "map_size": info["map_size"]}


def status_of(d: "Daemon") -> Status:
    summaries = d.catalog.meta("epoch_summaries", {}) or {}
    epochs = [EpochSummary(epoch=int(k), **v) for k, v in sorted(summaries.items(), key=lambda kv: int(kv[0]))]
    quarantined = [{"path": p, "reason": i.get("reason", ""), "at": i.get("at")}
                   for p, i in d.catalog.files().items() if i.get("quarantined")]
    eps = d.catalog.epochs()
    pacer = d.traffic.pacer
    return Status(
        version=__version__, uptime_s=time.time() - d.started, source=d.settings.source,
        cache_dir=str(d.settings.cache_dir.resolve()), bytes=d.catalog.resident_bytes,
        max_bytes=d.max_bytes, samples=d.catalog.resident_rows, shards=d.catalog.shard_count(),
        map_size=d.map_size, disk_free=shutil.disk_usage(d.settings.cache_dir).free,
        epochs_sealed=len(eps), last_epoch=eps[-1] if eps else -1, epochs=epochs,
        sampler={"state": sampler_state(d), "reason": d.paused_reason, "processes": d.supervisor.size,
                 "in_flight": d.supervisor.pending(), "restarts": d.supervisor.restarts},
        ingest={**ingest_rate(d), "commits": d.writer.commits},
        remote={"bytes_read": d.traffic.total(), "bytes_since_last_epoch": d.traffic.since_seal()},
        pacing={"mode": pacer.mode, "replace_per_epoch": pacer.replace_per_epoch, "max_ingest_rate": pacer.max_rate,
                "allowance_bytes": int(pacer.allowance), "reason": pacer.reason},
        remote_errors=d.remote_errors, last_error=d.last_error, quarantined=quarantined,
        coverage=d.planner.coverage() if d.planner else None, settings=d.settings.public(),
        evictions=d.evicted_shards, eviction_policy=d.policy, leases=[{k: v for k, v in l.to_json().items() if k != "run"} for l in d.leases.live()],
        jobs=d.jobs.active(), pinned_epochs=sorted(d.epochs.pinned_epochs()), lmdb=lmdb_usage(d))
