"""On PYTHONPATH of a daemon under test: while the file named by TEST_BREAK_PYARROW exists, a new Python process
cannot import pyarrow, as with a broken install under a running daemon (the daemon itself imported it at start)."""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec
from typing import Any

FLAG = os.environ.get("TEST_BREAK_PYARROW")


class _BrokenPyarrow:
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError(f"simulated broken install: cannot import {name}")
        return None


if FLAG and os.path.exists(FLAG):
    sys.meta_path.insert(0, _BrokenPyarrow())
