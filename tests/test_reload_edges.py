"""SIGHUP edge cases: the default config file deleted before a reload, and a SIGHUP while the daemon starts."""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from samplecache.service import config as config_mod
from samplecache.service.config import load
from samplecache.service.reload import Reloader


@pytest.fixture(autouse=True)
def _no_samplecache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.upper().startswith("SAMPLECACHE_"):
            monkeypatch.delenv(k)


class _Daemon:
    """Records what a reload asks the daemon to change."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

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
