"""``--py-spy``: the daemon and its samplers sampled by ``py-spy record --subprocesses`` during the ingest, and
the busy samples summarized: by process (the daemon or a sampler), self time by frame in each, and inclusive
time of samplecache's own functions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

IDLE_FRAMES = ("select (", "wait (", "_PollLikeSelector.select", "EpollSelector.select", "Condition.wait",
               "Event.wait", "_recv_bytes", "_recv (", "poll (", "Queue.get", "sleep (")


def summarize_raw_profile(path: Path, top: int = 25) -> dict[str, Any]:
    self_t: dict[str, Counter[str]] = {"daemon": Counter(), "sampler": Counter()}
    incl: Counter[str] = Counter()
    procs: Counter[str] = Counter()
    n = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = stack.split(";")
        if frames[-1].startswith(IDLE_FRAMES):
            continue
        owners = [f for f in frames if f.startswith("process ")]
        kind = "sampler" if owners and "spawn_main" in owners[-1] else "daemon"
        frames = [f for f in frames if not f.startswith("process ")]
        if not frames:
            continue
        n += c
        procs[kind] += c
        self_t[kind][frames[-1]] += c
        for f in set(frames):
            if "service/" in f or "client/" in f:
                incl[f] += c
    return {"samples": n, "by_process": dict(procs),
            "self": {k: v.most_common(top) for k, v in self_t.items()},
            "samplecache_inclusive": incl.most_common(top)}
