"""Where things are, for the tests and their helper scripts: the repository, tests/, the support modules, scripts."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SUPPORT = TESTS / "support"
SCRIPTS = SUPPORT / "scripts"
