"""SIGHUP edge cases: the default config file deleted before a reload, and a SIGHUP while the daemon starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from samplecache_service.config import file as config_mod
from samplecache_service.config.file import load
from samplecache_service.ops.reload import Reloader


@pytest.fixture(autouse=True)
def _no_samplecache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.upper().startswith("SAMPLECACHE_"):
            monkeypatch.delenv(k)


class _Daemon:
    """Records what a reload asks the daemon to change."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def runtime_config(self) -> dict[str, Any]:
        return {}  # the values in use: as loaded (a reload then compares with the settings it holds)

    def configure(self, **kw: Any) -> "Future[None]":
        self.calls.append(kw)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


def test_reload_after_the_default_config_file_is_deleted_changes_nothing(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "samplecache.toml"
    default.write_text('source = "s3://b/p/"\nmax_bytes = "500GiB"\n')
    monkeypatch.setattr(config_mod, "DEFAULT_CONFIG", default)
    d = _Daemon()
    reloader = Reloader({}, None, load({}), d, lambda level: None)  # type: ignore[arg-type]
    default.write_text('source = "s3://b/p/"\nmax_bytes = "400GiB"\n')
    assert reloader.reload()["applied"] == {"max_bytes": 400 * 2**30}
    default.unlink()
    got = reloader.reload()
    assert "no such config file" in (got["error"] or "") and str(default) in got["error"]
    assert got["applied"] == {} and d.calls == [{"max_bytes": 400 * 2**30}]  # not back to the 10GiB default
    assert reloader.state["last_error"] == got["error"] and reloader.state["file"] == str(default)


def test_reload_without_a_config_file_at_start_finds_one_made_later(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "samplecache.toml"
    monkeypatch.setattr(config_mod, "DEFAULT_CONFIG", default)
    d = _Daemon()
    reloader = Reloader({"source": "s3://b/p/"}, None, load({"source": "s3://b/p/"}), d,  # type: ignore[arg-type]
                        lambda level: None)
    default.write_text('max_bytes = "3GiB"\n')
    assert reloader.reload() == {"applied": {"max_bytes": 3 * 2**30}, "needs_restart": [], "error": None}


def test_sighup_while_the_daemon_starts_does_not_kill_it(tmp_path: Path) -> None:
    """A SIGHUP (``systemctl reload``) during a slow start (the first listing of a large remote) used to meet
    Python's default action and end the process; it is held until the reloader exists."""
    stall = socket.socket()
    stall.bind(("127.0.0.1", 0))
    stall.listen(8)
    stall.settimeout(60)
    endpoint = f"http://127.0.0.1:{stall.getsockname()[1]}"  # accepts, never answers: discovery waits on it
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("SAMPLECACHE_", "AWS_"))}
    env.update(AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_DEFAULT_REGION="us-east-1")
    opts = json.dumps({"client_kwargs": {"endpoint_url": endpoint}, "config_kwargs": {"retries": {"max_attempts": 1}}})
    proc = subprocess.Popen([sys.executable, "-m", "samplecache_service", "serve", "--source", "s3://b/p/",
                             "--cache-dir", str(tmp_path / "cache"), "--samplers", "1", "--port", "0",
                             "--storage-options", opts], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    conns = []
    try:
        conns.append(stall.accept()[0])  # the daemon is in its first listing of the remote
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None, f"SIGHUP ended the starting daemon (exit {proc.returncode})"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()
        for c in conns:
            c.close()
        stall.close()


def test_a_stop_waits_for_a_reload_under_way_and_ends_the_reloads(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's stop closes LMDB: a reload still changing its sources must end first (or be named)."""
    import threading
    default = tmp_path / "samplecache.toml"
    monkeypatch.setattr(config_mod, "DEFAULT_CONFIG", default)
    inside, go_on = threading.Event(), threading.Event()

    class Slow(_Daemon):
        def configure(self, **kw: Any) -> "Future[None]":
            inside.set()
            go_on.wait(10)
            return super().configure(**kw)
    d = Slow()
    reloader = Reloader({"source": "s3://b/p/"}, None, load({"source": "s3://b/p/"}), d,  # type: ignore[arg-type]
                        lambda level: None)
    reloader.start()
    default.write_text('max_bytes = "3GiB"\n')
    reloader.request()
    assert inside.wait(10)
    assert reloader.stop(timeout=0.2) is False  # still inside the daemon
    go_on.set()
    assert reloader.stop(timeout=10) is True and d.calls == [{"max_bytes": 3 * 2**30}]
    default.write_text('max_bytes = "4GiB"\n')
    reloader.request()  # after the stop: no reload
    assert reloader.state["reloads"] == 1 and d.calls == [{"max_bytes": 3 * 2**30}]
