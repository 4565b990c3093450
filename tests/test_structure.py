"""The house keeps its shape: the import-linter contracts hold (and would catch a layer crossed), ruff is clean,
and every module opens with its purpose."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PACKAGES = [REPO / "service" / "samplecache_service", REPO / "client" / "samplecache",
            REPO / "client" / "samplecache_tools", REPO / "benchmarks"]


def lint_imports(cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    return subprocess.run([str(BIN / "lint-imports"), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_import_contracts_hold() -> None:
    r = lint_imports(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout, r.stdout


@pytest.mark.parametrize("module, line, broken", [
    # a low layer reaching up
    ("service/samplecache_service/store/catalog.py", "from samplecache_service.http import status", "layers"),
    # the daemon importing torch, or the client's reading code
    ("service/samplecache_service/remote/planner.py", "import torch", "never imports torch"),
    ("service/samplecache_service/epochs/leases.py", "from samplecache.reading.blocks import reader",
     "never imports torch"),
    # the client importing the daemon
    ("client/samplecache/reading/ordering/partition.py", "import samplecache_service.daemon",
     "never imports the daemon"),
    # the wire format importing a side
    ("client/samplecache/format/nested.py", "from samplecache.api import client", "imports neither side"),
    # the order reaching for the blocks
    ("client/samplecache/reading/ordering/stream.py", "from samplecache.reading.blocks import gather", "stay apart"),
    # one benchmark reaching into another's package, or the harness into a benchmark
    ("benchmarks/tf_feed.py", "from benchmarks.suite import peers", "stands alone"),
    ("benchmarks/harness/data.py", "from benchmarks.ingest import report", "stands alone"),
])
def test_a_crossed_layer_breaks_a_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    """The contracts are not vacuous: one violating import in a copy of the tree makes lint-imports fail, naming
    the contract and the import."""
    for top in ("client", "service", "benchmarks"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__", "swagger_ui"))
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}\n")
    r = lint_imports(tmp_path, f"{tmp_path / 'client'}{os.pathsep}{tmp_path / 'service'}")
    assert r.returncode != 0, r.stdout
    broken_part = r.stdout.split("Broken contracts", 1)[-1]
    assert broken in broken_part, r.stdout
    assert module.split("/", 1)[1].removesuffix(".py").replace("/", ".") in broken_part, r.stdout


def test_ruff_is_clean() -> None:
    r = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "--output-format", "concise", "."], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_module_opens_with_its_purpose() -> None:
    missing = [str(p.relative_to(REPO)) for pkg in PACKAGES for p in sorted(pkg.rglob("*.py"))
               if "swagger_ui" not in p.parts and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, missing


def test_every_benchmark_is_under_the_harness_contract() -> None:
    """A new benchmark (a module or a package under benchmarks/) is a sibling in the contract that keeps each one
    standing alone over the harness, or that contract would not see it."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["name"].startswith("Each benchmark stands alone"))
    listed = {m.strip() for m in layers[0].split("|")}
    found = {f"benchmarks.{p.stem}" for p in (REPO / "benchmarks").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__main__.py").is_file()}
    assert layers[1:] == ["benchmarks.harness"] and listed == found, (listed ^ found)
