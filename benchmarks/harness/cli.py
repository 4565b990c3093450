"""The command line every benchmark shares: flags, sizes, comma-separated subsets, the log.

``parser(doc)`` is an ``ArgumentParser`` whose description is the module docstring's first paragraph and
whose epilog is the whole docstring. ``common(p, workdir=..., quick=...)`` adds ``--quick``, ``--json PATH``
and ``--workdir DIR`` (default ``./bench-data`` or below it: git-ignored). ``loader_sizes(p)`` adds
``--small/--large/--passes`` and ``sizes(a, p)`` resolves them (defaults 400,000 / 3,000 / 3; ``--quick``
20,000 / 64 / 1). ``subset(p, flag, value, allowed)`` parses ``--datasets small,large``-style flags.
``parse_size("200MB")`` -> 200_000_000, ``parse_size("1GiB")`` -> 1 << 30; ``human(n)`` is the other way.
``log(msg)`` writes progress to stderr (stdout holds the report).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

BENCH_DATA = Path("bench-data")
_UNITS = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "K": 10**3, "M": 10**6, "G": 10**9, "B": 1}


def log(msg: str) -> None:
    """Progress to stderr, flushed (the report itself goes to stdout)."""
    print(msg, file=sys.stderr, flush=True)


def parse_size(s: str) -> int:
    """Bytes of '200MB', '1GiB', '1.5 GB', '4096' (SI: 10**3 steps; IEC: 2**10 steps)."""
    t = s.strip().upper().replace(" ", "")
    try:
        for u, m in _UNITS.items():
            if t.endswith(u) and t[: -len(u)]:
                return int(float(t[: -len(u)]) * m)
        return int(t)
    except ValueError:
        raise ValueError(f"not a size: {s!r} (examples: 4096, 200MB, 1GiB)") from None


def human(n: float) -> str:
    """Bytes in IEC units: '1.0 GiB', '64.0 MiB', '512 B'."""
    for unit, m in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= m:
            return f"{n / m:.1f} {unit}"
    return f"{int(n)} B"


def parser(doc: str | None) -> argparse.ArgumentParser:
    doc = doc or ""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def common(p: argparse.ArgumentParser, workdir: Path = BENCH_DATA, quick: str = "tiny sizes, one pass (a smoke run)",
           json_help: str = "write the results here") -> None:
    """``--quick``, ``--json PATH``, ``--workdir DIR``."""
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--json", type=Path, default=None, help=json_help)
    p.add_argument("--workdir", type=Path, default=workdir, help=f"data and caches (default ./{workdir})")


def loader_sizes(p: argparse.ArgumentParser, small: str = "400000", large: str = "3000") -> None:
    """``--small N``, ``--large N``, ``--passes N`` of the loader benchmarks."""
    p.add_argument("--small", type=int, default=None, help=f"SMALL samples (default {small}; --quick: 20000)")
    p.add_argument("--large", type=int, default=None, help=f"LARGE samples (default {large}; --quick: 64)")
    p.add_argument("--passes", type=int, default=None, help="timed passes per row (default 3; --quick: 1)")


def sizes(a: argparse.Namespace, p: argparse.ArgumentParser) -> tuple[int, int, int]:
    """(SMALL samples, LARGE samples, timed passes) from ``--small/--large/--passes/--quick``."""
    n_small = a.small if a.small is not None else (20_000 if a.quick else 400_000)
    n_large = a.large if a.large is not None else (64 if a.quick else 3_000)
    passes = a.passes if a.passes is not None else (1 if a.quick else 3)
    if n_small < 1 or n_large < 1 or passes < 1:
        p.error("--small, --large and --passes must be >= 1")
    return n_small, n_large, passes


def subset(p: argparse.ArgumentParser, flag: str, value: str, allowed: Sequence[str]) -> list[str]:
    """The comma-separated ``value`` of ``flag``, each in ``allowed`` and at least one (else a usage error)."""
    got = [s.strip() for s in value.split(",") if s.strip()]
    if not got or any(x not in allowed for x in got):
        p.error(f"{flag} takes a comma-separated subset of {','.join(allowed)}")
    return got


def ints(p: argparse.ArgumentParser, flag: str, value: str) -> list[int]:
    """``--workers 0,2``-style lists of integers >= 0."""
    try:
        got = [int(w) for w in value.split(",") if w.strip()]
    except ValueError:
        p.error(f"{flag} takes comma-separated integers")
    if any(w < 0 for w in got):
        p.error(f"{flag} takes integers >= 0")
    return got
