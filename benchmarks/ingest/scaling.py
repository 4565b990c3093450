"""``--scaling 1,2,4``: the ingest (the daemon on a fresh cache) and the raw read with the same number of
readers, for each sampler count; where the rate stops scaling, and why:

* cores saturated: the machine is busy on (nearly) all its cores;
* daemon-bound: the daemon's main process (LMDB writer, scheduler, HTTP: one GIL) or one of its threads is busy
  a whole core, or the samplers sit idle waiting for units;
* server-bound: the raw read with as many readers stops scaling too (the S3 server is the limit).

Counts above the machine's cores run only with ``--oversubscribe`` and are marked so."""

from __future__ import annotations

import os
from typing import Any, Callable

GAIN = 0.5  # a step "scales" when it gains at least half of the ideal (2x counts -> >= 1.5x rate)
BUSY = 0.8  # a core (or all cores) counts as saturated from this fraction on


def default_counts() -> list[int]:
    """1, 2, 4, ... up to the cores this process may use."""
    cores, out, n = len(os.sched_getaffinity(0)), [], 1
    while n <= cores:
        out.append(n)
        n *= 2
    return out


def parse_counts(text: str, oversubscribe: bool) -> list[int]:
    """``auto`` | ``none`` | ``1,2,4``; counts above the cores need ``oversubscribe``."""
    if text == "none":
        return []
    if text == "auto":
        return default_counts()
    counts = sorted({int(v) for v in text.split(",") if v.strip()})
    if not counts or counts[0] < 1:
        raise ValueError("--scaling takes sampler counts >= 1, 'auto' or 'none'")
    cores = len(os.sched_getaffinity(0))
    if counts[-1] > cores and not oversubscribe:
        raise ValueError(f"--scaling {counts[-1]} is more than this machine's {cores} cores: "
                         f"add --oversubscribe to run it (marked oversubscribed)")
    return counts


def row_of(n: int, raw: dict[str, Any], ing: dict[str, Any]) -> dict[str, Any]:
    cores = ing["warm_cores"]
    return {"samplers": n, "oversubscribed": n > len(os.sched_getaffinity(0)),
            "raw_mb_per_s": raw["mb_per_s"], "raw_proc_cpu_ms_per_mb": raw["proc_cpu_ms_per_mb"],
            "raw_cores_busy": raw["cores_busy"],
            "mb_per_s": ing["warm_mb_per_s"], "x_raw": ing["warm_mb_per_s"] / raw["mb_per_s"],
            "mb_per_s_after_healthz": ing["mb_per_s"],
            "proc_cpu_ms_per_mb": ing["proc_cpu_ms_per_mb"], "cpu_ms_per_mb": ing["cpu_ms_per_mb"],
            "cores_busy": cores["machine"], "server_cores": cores["server"],
            "daemon_main_cores": cores["daemon_main"], "samplers_cores": cores["samplers"],
            "busiest_thread_cores": cores.get("busiest_thread", 0.0),
            "sampler_occupancy": ing["sampler_occupancy"], "verified": ing["verified"]}


def run_scaling(counts: list[int], known: dict[int, tuple[dict[str, Any], dict[str, Any]]],
                measure: Callable[[int], tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """One row per count (``known``: counts measured already, as (raw pass, ingest)); the verdict."""
    rows = []
    for n in counts:
        raw, ing = known[n] if n in known else measure(n)
        rows.append(row_of(n, raw, ing))
    return {"rows": rows, "verdict": verdict(rows, len(os.sched_getaffinity(0)))}


def _scales(a: float, b: float, na: int, nb: int) -> bool:
    return b / a >= 1 + GAIN * (nb / na - 1) - 0.01  # 0.01: a rate shown as 1.50x for twice the samplers scales


def why(row: dict[str, Any], raw_scaled: bool, cores: int) -> str:
    own = row["server_cores"] + row["samplers_cores"] + row["daemon_main_cores"]
    parts = (f"S3 server {row['server_cores']:.2f}, samplers {row['samplers_cores']:.2f}, daemon "
             f"{row['daemon_main_cores']:.2f} (busiest thread {row['busiest_thread_cores']:.2f})")
    if row["cores_busy"] >= BUSY * cores:
        who = "nearly all by this run" if own >= 0.9 * row["cores_busy"] else "the rest by other work on the machine"
        return (f"cores saturated: the machine busy {row['cores_busy']:.2f} of {cores} cores, "
                f"{own:.2f} by this run ({parts}); {who}")
    if row["daemon_main_cores"] >= BUSY or row["busiest_thread_cores"] >= BUSY:
        return (f"daemon-bound (writer): its main process busy {row['daemon_main_cores']:.2f} cores, its busiest "
                f"thread {row['busiest_thread_cores']:.2f}; samplers occupied {100 * row['sampler_occupancy']:.0f}%")
    if row["server_cores"] >= BUSY or (not raw_scaled and row["x_raw"] >= 0.8):
        return (f"server-bound: the ingest at {row['x_raw']:.2f}x the raw read with {row['samplers']} readers "
                f"({row['raw_mb_per_s']:,.0f} MB/s), which stops scaling too; {parts}")
    if row["sampler_occupancy"] < 0.8:
        return (f"daemon-bound (scheduling): the samplers wait for units {100 * (1 - row['sampler_occupancy']):.0f}% "
                f"of the time while the machine has {cores - row['cores_busy']:.2f} cores idle; {parts}")
    return f"not determined: the machine busy {row['cores_busy']:.2f} of {cores} cores; {parts}"


def verdict(rows: list[dict[str, Any]], cores: int) -> str:
    if len(rows) < 2:
        return "one sampler count only: nothing to compare"
    for a, b in zip(rows, rows[1:]):
        if not _scales(a["mb_per_s"], b["mb_per_s"], a["samplers"], b["samplers"]):
            raw_scaled = _scales(a["raw_mb_per_s"], b["raw_mb_per_s"], a["samplers"], b["samplers"])
            return (f"stops scaling at {b['samplers']} samplers ({a['mb_per_s']:,.0f} -> {b['mb_per_s']:,.0f} MB/s, "
                    f"{b['mb_per_s'] / a['mb_per_s']:.2f}x for {b['samplers'] / a['samplers']:.0f}x samplers): "
                    + why(b, raw_scaled, cores))
    first, last = rows[0], rows[-1]
    tail = "" if last["samplers"] < cores else f"; no more cores here to go further ({cores})"
    return (f"scales through {last['samplers']} samplers ({last['mb_per_s'] / first['mb_per_s']:.2f}x from "
            f"{first['samplers']}){tail}")
