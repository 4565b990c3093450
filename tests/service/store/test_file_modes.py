"""The modes of what the daemon creates in its cache dir do not depend on the umask (README "Files and secrets"):
the LMDB dir 0750, data.mdb and lock.mdb 0660 (a reader in the group takes its slot in lock.mdb), daemon.lock
0640, and a token file's new dir 0750. The end-to-end check, a reader only in the group, is
tests/e2e/test_e2e_group_reader.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator

import pytest

from samplecache_service.config.settings import Settings
from samplecache_service.http.auth import resolve_token
from samplecache_service.store.cachedir import lock_cache_dir
from samplecache_service.store.lmdbmap import open_env


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o022, 0o077, 0o000], ids=["umask022", "umask077", "umask000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_the_lmdb_dir_and_files_have_their_modes_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    env, _ = open_env(tmp_path / "lmdb", 1 << 24)
    env.close()
    assert oct(mode(tmp_path / "lmdb")) == oct(0o750)
    assert oct(mode(tmp_path / "lmdb" / "data.mdb")) == oct(0o660)
    assert oct(mode(tmp_path / "lmdb" / "lock.mdb")) == oct(0o660)


def test_the_daemon_lock_is_0640_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    fd = lock_cache_dir(tmp_path)
    os.close(fd)
    assert oct(mode(tmp_path / "daemon.lock")) == oct(0o640)


def test_a_cache_made_under_another_umask_gets_its_modes_at_the_next_start(tmp_path: Path) -> None:
    """A cache an older version made under umask 022 (dir 0755, files 0640) is put right when it is opened."""
    lmdb_dir = tmp_path / "lmdb"
    env, _ = open_env(lmdb_dir, 1 << 24)
    env.close()
    os.chmod(lmdb_dir, 0o755)
    for name in ("data.mdb", "lock.mdb"):
        os.chmod(lmdb_dir / name, 0o640)
    env, _ = open_env(lmdb_dir, 1 << 24)
    env.close()
    assert [oct(mode(p)) for p in (lmdb_dir, lmdb_dir / "data.mdb", lmdb_dir / "lock.mdb")] == [
        oct(0o750), oct(0o660), oct(0o660)]


def test_a_token_file_in_a_dir_not_made_yet_is_reachable_by_the_group(tmp_path: Path, umask: int) -> None:
    """``--token-file`` in a dir that does not exist yet: the daemon makes the dir 0750, like its own."""
    path = tmp_path / "secrets" / "api-token"
    assert resolve_token(Settings(token_file=path, cache_dir=tmp_path / "cache"))
    assert (oct(mode(path.parent)), oct(mode(path))) == (oct(0o750), oct(0o640))
