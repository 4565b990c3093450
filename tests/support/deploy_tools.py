"""Helpers of the deployment tests (test_deploy, test_systemd, test_container, test_k8s): where the files are, the
external tools they run, and the parser of systemd unit files.

A missing tool fails the test with its install hint, except where a test says otherwise: a hidden skip would let the
deployment files rot.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
INSTALL_TEST_EXTRA = "install the test extra: pip install -e '.[test]'"
INSTALL_SYSTEMD = "install systemd's tools: apt-get install systemd"


def tool(name: str, hint: str) -> str:
    """Path of a tool next to this interpreter (an unactivated venv) or on PATH; else fail."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"`{name}` not found next to {sys.executable} nor on PATH: {hint}")
    return found


def run(cmd: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def console_script() -> str:
    """The `samplecache` entry point that `pip install` created for this interpreter."""
    path = Path(sys.executable).parent / "samplecache"
    if path.is_file():
        return str(path)
    which = shutil.which("samplecache")
    if not which:
        pytest.fail(f"the `samplecache` console script is not installed: {INSTALL_TEST_EXTRA}")
    return which


def unit_directives(text: str) -> dict[str, list[str]]:
    """'Section.Key' -> values in file order (keys may repeat), comments and blanks dropped."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line in the unit: {raw!r}"
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


def one(d: dict[str, list[str]], key: str) -> str:
    values = d.get(key, [])
    assert len(values) == 1, f"{key}: expected exactly one value, got {values}"
    return values[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return int(resp.status), resp.read()


def wait_get(url: str, seconds: float, timeout: float = 5.0) -> tuple[int, bytes]:
    """``get(url)`` until the server answers (an HTTP error status is an answer); fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return get(url, timeout)
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError as e:
            assert time.monotonic() < deadline, f"no answer from {url} within {seconds:.0f} s: {e}"
            time.sleep(0.3)
