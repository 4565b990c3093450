"""``mypy --strict`` over the daemon (samplecache.service) and the wire format (samplecache.format.record, .nested)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_strict_is_clean() -> None:
    got = subprocess.run(["bash", str(ROOT / "scripts" / "typecheck.sh")], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}, timeout=900)
    assert got.returncode == 0, got.stdout[-6000:] + got.stderr[-2000:]
    assert "Success" in got.stdout, got.stdout
