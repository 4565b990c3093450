"""One-off move of benchmarks/ into one package per multi-module benchmark (issue 20), run once from the flat tree.

A benchmark with helper modules becomes ``benchmarks/<name>/`` (``main.py`` the CLI, ``__main__.py`` its entry, the
helpers without their ``<name>_`` prefix); a single-module benchmark stays ``benchmarks/<name>.py``. Either way
``python -m benchmarks.<name>`` is unchanged. The script git-moves the files, then rewrites the imports in the moved
modules and the dotted names and paths in benchmarks/, docs/, README.md, tests/, scripts/ and pyproject.toml.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
B = REPO / "benchmarks"

# package -> {old module: new module}; "main" is the benchmark's CLI
PACKAGES = {
    "ingest": {"ingest": "main", **{f"ingest_{h}": h for h in (
        "cpu", "daemon", "data", "raw", "report", "rolling", "scaling", "spy", "stages")}},
    "daemon_scale": {"daemon_scale": "main", "scale_cache": "cache", "scale_load": "load", "scale_read": "read"},
    "suite": {"suite": "main", "suite_report": "report", "peers": "peers"},
    "fidelity": {"fidelity": "main", "fidelity_plots": "plots"},
}
PURPOSE = {
    "ingest": "S3 -> LMDB ingest rate against raw s3fs reads of the same row groups.",
    "daemon_scale": "manifest latency under 64 clients, daemon RSS and read rate, at 100k shards.",
    "suite": "samplecache against the peer loaders on the same data, every batch verified.",
    "fidelity": "does the rolling 25% cache train as well as the full data?",
}
# where text outside the package names a moved module: old -> new, dotted and as a path
MOVED = {old: f"{pkg}.{new}" for pkg, mods in PACKAGES.items() for old, new in mods.items() if new != "main"}
MAINS = {pkg for pkg in PACKAGES}
TEXT_FILES = ["README.md", "pyproject.toml", "docs/*.md", "tests/**/*.py", "scripts/*.sh", "benchmarks/**/*.py",
              "benchmarks/*.sh"]


def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=REPO, check=True)


def move() -> None:
    for pkg, mods in PACKAGES.items():
        # the CLI module and the package share a name: move it aside first
        git("mv", f"benchmarks/{pkg}.py", f"benchmarks/{pkg}_main.py")
        (B / pkg).mkdir()
        git("mv", f"benchmarks/{pkg}_main.py", f"benchmarks/{pkg}/main.py")
        for old, new in mods.items():
            if new != "main":
                git("mv", f"benchmarks/{old}.py", f"benchmarks/{pkg}/{new}.py")


def init_text(pkg: str) -> str:
    return (f'"""The {pkg} benchmark: {PURPOSE[pkg]}\n\n'
            f'``python -m benchmarks.{pkg}`` runs ``main`` (the command line); the other modules are its parts.\n"""\n')


def entry(pkg: str) -> None:
    """``__init__.py`` (the purpose) and ``__main__.py`` (what ``if __name__ == "__main__"`` ran) of a package."""
    main = B / pkg / "main.py"
    text = main.read_text()
    block = re.search(r'\n\nif __name__ == "__main__":\n(    .*\n)+\Z', text)
    assert block, pkg
    body = text[: block.start()].rstrip("\n") + "\n"
    # the block was the only user of sys in fidelity
    if "sys." not in body:
        body = body.replace("\nimport sys\n", "\n")
    main.write_text(body)
    call = block.group(0).split("\n", 3)[3]
    imports = "import sys\n\n" if "sys." in call else ""
    (B / pkg / "__init__.py").write_text(init_text(pkg))
    (B / pkg / "__main__.py").write_text(
        f'"""``python -m benchmarks.{pkg}``: runs ``benchmarks.{pkg}.main``."""\n\n'
        f"{imports}from .main import main\n\nif __name__ == \"__main__\":\n{call}")
    git("add", f"benchmarks/{pkg}/__init__.py", f"benchmarks/{pkg}/__main__.py")


def rewrite_package_imports(pkg: str) -> None:
    """Inside the package: the harness is one level up, the siblings lost their prefix."""
    for f in sorted((B / pkg).glob("*.py")):
        t = f.read_text()
        t = re.sub(r"^(\s*from )\.harness\b", r"\1..harness", t, flags=re.M)
        for old, new in PACKAGES[pkg].items():
            t = re.sub(rf"^(\s*from )\.{old}\b", rf"\1.{new}", t, flags=re.M)
            t = re.sub(rf"^(\s*from \. import ){old} as\b", rf"\1{new} as", t, flags=re.M)
        f.write_text(t)


def rewrite_specials() -> None:
    """What the generic rewrites do not cover: fidelity's absolute import of its plots, tf_feed's use of the suite's
    peers, and the suite's paths relative to benchmarks/ (results/) and the repository (docs/)."""
    edits = {
        "fidelity/main.py": [("from benchmarks import fidelity_plots", "from . import plots"),
                             ("fidelity_plots.", "plots.")],
        "tf_feed.py": [("from . import peers as pe", "from .suite import peers as pe")],
        "suite/main.py": [("HERE = Path(__file__).resolve().parent\n",
                           "BENCHMARKS = Path(__file__).resolve().parents[1]  # results/ here, docs/ beside it\n"),
                          ("HERE / ", "BENCHMARKS / "), ("HERE.parent / ", "BENCHMARKS.parent / ")],
    }
    for pkg in ("daemon_scale", "suite", "fidelity"):
        edits[f"{pkg}/main.py"] = [*edits.get(f"{pkg}/main.py", []), (
            "p = cli.parser(__doc__)\n", f'p = cli.parser(__doc__)\n    p.prog = "python -m benchmarks.{pkg}"\n')]
    for name, pairs in edits.items():
        f = B / name
        t = f.read_text()
        for old, new in pairs:
            assert old in t, (name, old)
            t = t.replace(old, new)
        f.write_text(t)


def rewrite_text(t: str) -> str:
    for old, new in MOVED.items():
        t = re.sub(rf"\bbenchmarks\.{old}\b", f"benchmarks.{new}", t)
        t = re.sub(rf"\bbenchmarks/{old}\.py\b", f"benchmarks/{new.replace('.', '/')}.py", t)
    for pkg in MAINS:
        t = re.sub(rf"\bbenchmarks/{pkg}\.py\b", f"benchmarks/{pkg}/main.py", t)
    return t


def main() -> None:
    move()
    for pkg in PACKAGES:
        entry(pkg)
        rewrite_package_imports(pkg)
    rewrite_specials()
    files = sorted({p for pattern in TEXT_FILES for p in REPO.glob(pattern)})
    for f in files:
        t = f.read_text()
        new = rewrite_text(t)
        if new != t:
            f.write_text(new)
            print("rewrote", f.relative_to(REPO))
    # relative imports moved: let ruff put them back in isort order
    subprocess.run([str(REPO / ".venv" / "bin" / "ruff"), "check", "-q", "--fix", "--select", "I001", "benchmarks"],
                   cwd=REPO, check=False)


if __name__ == "__main__":
    main()
