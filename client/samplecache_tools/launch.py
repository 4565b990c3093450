"""Starting a local daemon as a subprocess (for the demo, benchmarks and tests).

The daemon runs as ``python -m samplecache_service serve ...`` in its own
process group; ``stop()`` sends SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DaemonProcess:
    """``samplecache serve`` in a subprocess, logging to ``log_path`` (``source`` None: from its config)."""

    def __init__(self, source: str | None, cache_dir: str | os.PathLike[str], *, port: int | None = None,
                 extra: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 log_path: str | os.PathLike[str] | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cache_dir = Path(cache_dir)
        self.log_path = Path(log_path) if log_path else self.cache_dir.parent / f"daemon-{self.port}.log"
        # source None: the sources come from elsewhere (a --config file, SAMPLECACHE_SOURCES)
        self.args = [sys.executable, "-m", "samplecache_service", "serve", *(["--source", source] if source else []),
                     "--cache-dir", str(cache_dir), "--host", "127.0.0.1", "--port", str(self.port), *extra]
        self.env = dict(os.environ if env is None else env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0, ready: bool = True) -> "DaemonProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        log.close()
        if ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"samplecache daemon exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        raise TimeoutError(f"samplecache daemon not healthy after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, wait ``grace`` seconds, then SIGKILL the process group. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything left in the group
        except (ProcessLookupError, PermissionError):
            pass
        code = self.proc.wait()
        return code

    def kill(self) -> None:
        """SIGKILL the daemon alone (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "DaemonProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
