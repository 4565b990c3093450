"""A port in use: ``serve`` says so in one line before it opens the cache or lists the source, and exits 3; the
README's table of exit codes names every code the commands return."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from paths import REPO

from samplecache_service.http.listen import PORT_IN_USE, listen_problem

README = REPO / "README.md"
COMMANDS = [*sorted((REPO / "service" / "samplecache_service" / "cli").glob("*.py")),
            REPO / "service" / "samplecache_service" / "store" / "verify.py",
            REPO / "client" / "samplecache_tools" / "demo.py", REPO / "client" / "samplecache_tools" / "devs3.py"]


def _held() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_port_in_use_is_named_with_the_way_out() -> None:
    with _held() as sock:
        port = sock.getsockname()[1]
        why = listen_problem("127.0.0.1", port)
    assert why is not None and f"port {port} on 127.0.0.1 is in use" in why and "--port" in why, why
    assert listen_problem("127.0.0.1", 0) is None
    assert listen_problem("127.0.0.1", port) is None  # free again (a closed listener's TIME_WAIT does not count)
    assert "not an address of this machine" in (listen_problem("192.0.2.1", port) or "")


def test_serve_on_a_port_in_use_exits_3_in_one_line_before_it_starts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAMPLECACHE_")}
    with _held() as sock:
        port = sock.getsockname()[1]
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "samplecache_service", "serve", "--source", "file:///nowhere",
                            "--cache-dir", str(tmp_path / "cache"), "--port", str(port)],
                           capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == PORT_IN_USE == 3, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"samplecache serve: port {port} on 127.0.0.1 is in "
                                                             f"use"), r.stderr
    assert not (tmp_path / "cache").exists() and time.monotonic() - t0 < 30  # nothing was opened or listed


def test_the_readme_names_every_exit_code() -> None:
    section = README.read_text().split("Exit codes", 1)[1].split("\n\n", 2)[1]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", section, re.M)}
    returned = {int(m) for path in COMMANDS for m in re.findall(r"\breturn (\d+)\b(?! *\+)", path.read_text())}
    returned |= {PORT_IN_USE, 128 + signal.SIGPIPE, 2}  # 2: argparse's usage error
    returned |= {1}  # SystemExit("message"): status and bench when the daemon cannot be reached
    assert returned <= documented, f"not in README.md's exit codes: {sorted(returned - documented)}"
    assert documented == {0, 1, 2, 3, 141}, documented
