"""What a benchmark prints and writes: host facts, rows as JSON, text tables, the JSON file, the exit code.

``host(versions=(...), **extra)`` is the host block of every JSON report: python, platform, cpus, load average
at the start (``Run.load_start``) and now, and the versions of the named distributions (None where not
installed). ``machine(versions)`` adds the CPU model, usable cores, RAM and the checkout's git state, for
documents. ``rows_json(rows)`` is the common JSON of ``verify.Row``s; ``text_table(head, lines)`` lays out
columns given as ``(text, width)`` cells (negative width: left-aligned). ``finish(path, result, rows)``
writes ``result`` as JSON (when ``path`` is given) and returns the exit code: 0 when every row that could
run was verified (rows of a missing peer or tool are reported, not failed), else 1.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterable, Sequence

from .verify import Row

REPO = Path(__file__).resolve().parents[2]
CORE_VERSIONS = ("numpy", "pyarrow")


def fmt(v: float | None, spec: str) -> str:
    """``v`` formatted, or '-' for None."""
    return "-" if v is None else format(v, spec)


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def versions(dists: Iterable[str]) -> dict[str, str | None]:
    """Installed version of each distribution, None where it is not installed."""
    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def host(load_start: list[float] | None, dists: Sequence[str] = CORE_VERSIONS, **extra: Any) -> dict[str, Any]:
    """The host block of a JSON report: python, platform, cpus, load average at start and end, versions."""
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "loadavg_start": load_start, "loadavg_end": loadavg(), **versions(dists), **extra}


def git_state() -> str | None:
    """The checkout's commit (``+dirty`` with uncommitted changes under client/ or service/)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "client", "service"],
                               cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def machine(dists: Sequence[str]) -> dict[str, Any]:
    """Host facts for a document: python, platform, cores (and usable), CPU model, RAM, versions, git."""
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cores": os.cpu_count()}
    try:
        info["cores_usable"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
                break
    except (OSError, ValueError):
        pass
    info["versions"] = versions(dists)
    info["git"] = git_state()
    return info


def load_note(load_start: list[float] | None) -> str:
    """One line: the load average then and now, and why it matters."""
    end = loadavg()
    a = "?" if not load_start else f"{load_start[0]:.2f}"
    b = "?" if not end else f"{end[0]:.2f}"
    return f"load average {a} -> {b} on {os.cpu_count()} cores: numbers are noisy on a shared machine"


def rows_json(rows: Sequence[Row], ratio: dict[int, float | None] | None = None,
              ratio_key: str = "ratio_to_limit") -> list[dict[str, Any]]:
    """The common JSON of loader rows; ``ratio``: row index -> a ratio stored under ``ratio_key``."""
    out = []
    for i, r in enumerate(rows):
        out.append({
            "loader": r.loader, "dataset": r.dataset, "workers": r.workers, "batch_size": r.batch_size,
            "informational": r.info, "samples": r.expected["samples"], "payload_bytes_per_sample": r.payload_bytes,
            "times_s": r.times_s, "median_s": r.median_s, "samples_per_s": r.samples_per_s,
            "mb_per_s": r.mb_per_s,
            "best_samples_per_s": (r.expected["samples"] / min(r.times_s)) if r.times_s else None,
            **({ratio_key: ratio.get(i)} if ratio is not None else {}),
            "verified": r.verified, "expected": r.expected, "passes": r.passes, "error": r.error,
            "missing": r.missing,
        })
    return out


def text_table(head: Sequence[tuple[str, int]], lines: Iterable[Sequence[tuple[str, int]]]) -> str:
    """Columns of ``(text, width)`` cells, joined by one space; width < 0 left-aligns in ``-width``. A rule
    under the head as long as it."""
    def row(cells: Sequence[tuple[str, int]]) -> str:
        return " ".join(f"{t:<{-w}}" if w < 0 else f"{t:>{w}}" for t, w in cells).rstrip()
    h = row(head)
    return "\n".join([h, "-" * len(h), *(row(c) for c in lines)])


def write_report(path: Path | None, result: Any) -> None:
    """``result`` as indented JSON in ``path`` (parents made); nothing when ``path`` is None."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, default=str))


def exit_code(rows: Iterable[Any]) -> int:
    """0 when every row that could run was verified (missing ones are reported, not failed), else 1."""
    return 0 if all(r.verified for r in rows if not getattr(r, "missing", None)) else 1


def finish(path: Path | None, result: dict[str, Any], rows: Sequence[Any]) -> int:
    """Write ``result`` to ``path`` (if given); the exit code of ``rows`` (``exit_code``)."""
    write_report(path, result)
    return exit_code(rows)
