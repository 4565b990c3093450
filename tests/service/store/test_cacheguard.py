"""The cache dir under a running daemon (store/cacheguard.py): removed or replaced (the dir, LMDB's data and lock
files, the daemon's lock file), each is named; an intact cache that is written to is not; the daemon's look dies
on a problem seen twice, not once. The daemon's /healthz and exit are in tests/e2e/test_e2e_cache_identity.py."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

import damage_data as dd
import pytest

from samplecache_service.store.cachedir import lock_cache_dir
from samplecache_service.store.cacheguard import CacheGuard


class Opened:
    """A cache dir as the daemon holds it: its lock, its LMDB environment open for writing, the guard."""

    def __init__(self, cache_dir: Path) -> None:
        self.dir, self.lmdb = cache_dir, cache_dir / "lmdb"
        cache_dir.mkdir()
        self.lock_fd = lock_cache_dir(cache_dir)
        self.cache = dd.Cache(self.lmdb)
        self.guard = CacheGuard(cache_dir, self.lmdb, self.lock_fd)

    def close(self) -> None:
        self.cache.close()
        self.guard.close()
        os.close(self.lock_fd)


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[Opened]:
    o = Opened(tmp_path / "cache")
    try:
        yield o
    finally:
        o.close()


def replace_file(path: Path) -> None:
    """What a copy put in place does: same bytes, another inode (the old one unlinked)."""
    shutil.copyfile(path, path.with_name(path.name + ".new"))
    os.replace(path.with_name(path.name + ".new"), path)


def rm_rf_and_a_new_daemon(o: Opened) -> None:
    """``rm -rf`` of the cache dir, then a second daemon makes a new cache at the same path."""
    shutil.rmtree(o.dir)
    o.dir.mkdir()
    fd = lock_cache_dir(o.dir)  # the lock file went with the dir: nothing stops the second daemon
    os.close(fd)
    dd.Cache(o.lmdb).close()


FAULTS: dict[str, tuple[Callable[[Opened], None], str]] = {
    "rm -rf": (lambda o: shutil.rmtree(o.dir), "the cache dir {dir} was removed"),
    "rm -rf, then a new cache": (rm_rf_and_a_new_daemon, "the cache dir {dir} was replaced"),
    "data.mdb removed": (lambda o: (o.lmdb / "data.mdb").unlink(), "the LMDB data file {lmdb}/data.mdb was removed"),
    "data.mdb replaced": (lambda o: replace_file(o.lmdb / "data.mdb"),
                          "the LMDB data file {lmdb}/data.mdb was replaced"),
    "lock.mdb replaced": (lambda o: replace_file(o.lmdb / "lock.mdb"),
                          "the LMDB lock file {lmdb}/lock.mdb was replaced"),
    "daemon.lock removed": (lambda o: (o.dir / "daemon.lock").unlink(),
                            "the daemon lock file {dir}/daemon.lock was removed"),
    "lmdb dir moved away": (lambda o: o.lmdb.rename(o.dir / "old"), "the LMDB data file {lmdb}/data.mdb was removed"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_removal_or_replacement_is_named(opened: Opened, fault: str) -> None:
    assert opened.guard.problem() is None
    act, expected = FAULTS[fault]
    act(opened)
    problem = opened.guard.problem()
    assert problem is not None and problem.startswith(expected.format(dir=opened.dir, lmdb=opened.lmdb)), problem
    assert "the daemon exits to be restarted" in problem


def test_an_intact_cache_that_is_written_to_is_fine(opened: Opened) -> None:
    for i in range(50):  # commits grow data.mdb in place: the same file
        opened.cache.writer.put_meta({f"k{i}": "x" * 10_000}).result()
    (opened.dir / "staging").mkdir()
    assert opened.guard.problem() is None


def test_an_unlinked_file_is_seen_by_its_link_count(opened: Opened, monkeypatch: pytest.MonkeyPatch) -> None:
    """``st_nlink`` of the fd the daemon holds tells, even where the path cannot be looked at."""
    real_stat = os.stat

    def no_access(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path).startswith(str(opened.lmdb)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", no_access)
    assert opened.guard.problem() is None  # no verdict from a path it cannot see
    (opened.lmdb / "data.mdb").unlink()
    assert (opened.guard.problem() or "").startswith(f"the LMDB data file {opened.lmdb}/data.mdb was removed")


def test_the_daemon_dies_on_a_problem_seen_twice(opened: Opened, caplog: pytest.LogCaptureFixture) -> None:
    died: list[str] = []
    with caplog.at_level(logging.CRITICAL, "samplecache.cacheguard"):
        opened.guard.watch(died.append)
        assert died == [] and not caplog.records
        (opened.dir / "daemon.lock").unlink()
        opened.guard.watch(died.append)  # first seen: logged, /healthz says it, not yet fatal
        assert died == []
        assert [r.__dict__.get("event") for r in caplog.records] == ["cache_dir_replaced"]
        opened.guard.watch(died.append)
    assert len(died) == 1 and died[0].startswith(f"the daemon lock file {opened.dir}/daemon.lock was removed")
