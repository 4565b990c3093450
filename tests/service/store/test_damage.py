"""Damaged cache files: the check before ``lmdb.open`` (cachedir.check_lmdb_file), ``samplecache verify``
(a scrub, beside a live writer too), the old-format message and --reset-cache's helper.

Every case reads the damaged file from a subprocess or from plain file reads: a truncated ``data.mdb`` that
LMDB maps kills the reader with SIGBUS (shown below), and the check exists so that nothing maps it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import damage_data as dd
import pytest
from paths import SUPPORT

from samplecache.format.constants import CACHE_ID_KEY
from samplecache_service.config.settings import Settings
from samplecache_service.store.cachedir import (
    COMMITTED,
    DamagedCacheFile,
    StartupError,
    check_identity,
    check_lmdb_file,
    reset_cache,
)


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(SUPPORT))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _verify(cache_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return _run("-m", "samplecache_service", "verify", "--cache-dir", str(cache_dir), *flags)


def _startup_error(lmdb_dir: Path) -> str:
    with pytest.raises(DamagedCacheFile) as ei:
        check_lmdb_file(lmdb_dir)
    assert isinstance(ei.value, StartupError)
    msg = str(ei.value)
    assert "\n" not in msg and str(lmdb_dir / "data.mdb") in msg and "--reset-cache" in msg, msg
    return msg


@pytest.fixture()
def built(tmp_path: Path) -> dd.Built:
    b = dd.build(tmp_path, shards=3, rows=20)
    (tmp_path / COMMITTED).write_text("{}")  # what check_identity writes after the first commit
    return b


# --- the check before lmdb.open ------------------------------------------------------------------


def test_a_whole_cache_and_a_fresh_dir_pass(built: dd.Built, tmp_path: Path) -> None:
    check_lmdb_file(built.lmdb_dir)
    check_lmdb_file(built.lmdb_dir / "data.mdb")
    check_lmdb_file(tmp_path / "new" / "lmdb")  # nothing there yet: a fresh start
    bare = tmp_path / "other" / "lmdb"
    bare.mkdir(parents=True)
    (bare / "data.mdb").write_bytes(b"")  # empty and nothing else: nothing was ever committed
    check_lmdb_file(bare)


def test_truncated_file_is_refused_where_lmdb_dies_of_sigbus(built: dd.Built) -> None:
    data = built.lmdb_dir / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    assert "it was truncated" in _startup_error(built.lmdb_dir)
    # what the check prevents: LMDB maps the short file and the first read past its end is SIGBUS
    proc = _run("-c", f"import damage_data as dd, pathlib; dd.read_all_blocks(pathlib.Path({str(built.lmdb_dir)!r}))")
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("cut", ["one_page", "half_meta", "last_page_less_one"])
def test_any_cut_is_refused(built: dd.Built, cut: str) -> None:
    data = built.lmdb_dir / "data.mdb"
    size = {"one_page": 4096, "half_meta": 60, "last_page_less_one": data.stat().st_size - 1}[cut]
    os.truncate(data, size)
    msg = _startup_error(built.lmdb_dir)
    assert ("cut short" in msg) if cut == "half_meta" else ("cut short" in msg or "truncated" in msg), msg


@pytest.mark.parametrize("state", ["lock.mdb", COMMITTED])
def test_zero_byte_file_with_state_is_refused(built: dd.Built, tmp_path: Path, state: str) -> None:
    os.truncate(built.lmdb_dir / "data.mdb", 0)
    if state == "lock.mdb":
        (tmp_path / COMMITTED).unlink()
    else:
        (built.lmdb_dir / "lock.mdb").unlink()
    msg = _startup_error(built.lmdb_dir)
    assert "empty (0 bytes)" in msg and state in msg


def test_missing_file_after_a_commit_is_refused(built: dd.Built) -> None:
    (built.lmdb_dir / "data.mdb").unlink()
    assert "is missing" in _startup_error(built.lmdb_dir)


@pytest.mark.parametrize("page", [0, 1])
@pytest.mark.parametrize("field,offset", [("magic", 16), ("version", 20), ("flags", 10)])
def test_damaged_meta_page_is_refused(built: dd.Built, page: int, field: str, offset: int) -> None:
    dd.flip(built.lmdb_dir / "data.mdb", page * 4096 + offset, 0x01 if field != "flags" else 0x08)
    msg = _startup_error(built.lmdb_dir)
    assert f"page {page}" in msg, msg
    proc = _verify(built.lmdb_dir.parent)
    assert proc.returncode == 1 and "DAMAGED" in proc.stdout and f"page {page}" in proc.stdout, proc


def test_check_identity_writes_the_marker(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    cache = dd.Cache(settings.lmdb_path)
    try:
        check_identity(cache.catalog, cache.writer, settings)
    finally:
        cache.close()
    marker = tmp_path / COMMITTED
    assert marker.is_file() and oct(marker.stat().st_mode & 0o777) == oct(0o640)
    assert json.loads(marker.read_text())["format"] == 3
    os.truncate(settings.lmdb_path / "data.mdb", 0)
    (settings.lmdb_path / "lock.mdb").unlink()
    _startup_error(settings.lmdb_path)  # the marker alone tells an emptied file from a fresh one
    reset_cache(settings)  # the way out
    assert not settings.lmdb_path.exists() and not marker.exists()
    check_lmdb_file(settings.lmdb_path)


def test_a_cache_gets_its_id_once_and_keeps_it(tmp_path: Path) -> None:
    """The id every manifest names: made when a cache is first opened (an old cache without one gets it at its
    first start), the same at every later start, another for a new cache at the same path."""
    settings = Settings(cache_dir=tmp_path)
    ids = []
    for _ in range(2):
        cache = dd.Cache(settings.lmdb_path)
        try:
            ids.append(check_identity(cache.catalog, cache.writer, settings))
            assert cache.catalog.meta(CACHE_ID_KEY) == ids[-1]
        finally:
            cache.close()
    assert ids[0] == ids[1] and len(ids[0]) == 32, ids
    reset_cache(settings)
    cache = dd.Cache(settings.lmdb_path)
    try:
        cache.writer.put_meta({"format": 3, "source": ""}).result()  # a cache from before ids: stamped, no id
        assert cache.catalog.meta(CACHE_ID_KEY) is None
        new = check_identity(cache.catalog, cache.writer, settings)
    finally:
        cache.close()
    assert new != ids[0] and len(new) == 32


def test_a_cache_that_holds_nothing_is_not_bound_to_its_source(tmp_path: Path) -> None:
    """A first start whose source never worked (``s3://no-such-bucket``) leaves the identity stamped but no data:
    a start with the right source takes the dir and keeps its id; once it holds data, another source is refused
    with the way out named."""
    wrong = Settings(cache_dir=tmp_path, source="s3://no-such-bucket/data/")
    right = Settings(cache_dir=tmp_path, source="s3://bucket/data/")
    cache = dd.Cache(wrong.lmdb_path)
    try:
        first = check_identity(cache.catalog, cache.writer, wrong)
        assert check_identity(cache.catalog, cache.writer, right) == first
        assert cache.catalog.meta("source") == right.source
        cache.writer.put_meta({"schema": {"columns": []}}).result()  # what a working listing writes first
        with pytest.raises(StartupError) as ei:
            check_identity(cache.catalog, cache.writer, wrong)
    finally:
        cache.close()
    msg = str(ei.value)
    assert "holds a sample of 's3://bucket/data/'" in msg and "--reset-cache" in msg, msg


def test_an_old_format_cache_names_the_way_out(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    cache = dd.Cache(settings.lmdb_path)
    try:
        cache.writer.put_meta({"format": 2, "source": ""}).result()
        with pytest.raises(StartupError, match="holds record format v2; this samplecache writes v3: restart "
                                               "with --reset-cache"):
            check_identity(cache.catalog, cache.writer, settings)
    finally:
        cache.close()


def test_reset_cache_keeps_the_dir_and_its_lock(built: dd.Built, tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    (tmp_path / "daemon.lock").write_text("")
    (settings.staging_dir / "rejected").mkdir(parents=True)
    (settings.staging_dir / "x.shard").write_bytes(b"x")
    reset_cache(settings)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.lock", "staging"]
    assert list(settings.staging_dir.iterdir()) == []


# --- samplecache verify ------------------------------------------------------------------------------


def test_verify_clean_cache(built: dd.Built) -> None:
    proc = _verify(built.lmdb_dir.parent)
    assert proc.returncode == 0, proc
    assert proc.stdout.startswith("clean: 15 blocks of 3 shards"), proc.stdout
    assert "100.0% 3/3 shards 15 blocks" in proc.stderr  # the final progress line, also without a terminal
    report = json.loads(_verify(built.lmdb_dir.parent, "--json").stdout)
    assert report["clean"] and report["blocks"] == 15 and report["bytes"] == sum(map(len, built.blocks.values()))


def test_verify_lists_every_flipped_block(built: dd.Built) -> None:
    data = built.lmdb_dir / "data.mdb"
    for (sid, b), extra in (((1, 0), 3), ((3, 2), 9000), ((3, 4), 12)):  # version byte, payload, header pad
        dd.flip(data, dd.block_offset(built, sid, b) + extra)
    proc = _verify(built.lmdb_dir.parent)
    assert proc.returncode == 1, proc
    lines = proc.stdout.splitlines()
    assert [ln.split(":")[1].strip() for ln in lines[:3]] == ["shard 1 block 0", "shard 3 block 2",
                                                              "shard 3 block 4"], proc.stdout
    assert "DAMAGED: 3 block(s) in 2 shard(s) (1, 3)" in lines[3] and "--reset-cache" in lines[3]
    report = json.loads(_verify(built.lmdb_dir.parent, "--json").stdout)
    assert not report["clean"] and report["damaged_shards"] == [1, 3]
    assert [(d["shard"], d["block"]) for d in report["damaged"]] == [(1, 0), (3, 2), (3, 4)]
    reasons = [d["reason"] for d in report["damaged"]]
    assert reasons[0] == f"record format v{3 ^ 0x5A}, not v3" and all("checksum mismatch" in r for r in reasons[1:])
    # --quick reads headers only: the flipped version byte of shard 1 block 0 is found, the other bytes are not
    quick = json.loads(_verify(built.lmdb_dir.parent, "--quick", "--json").stdout)
    assert [(d["shard"], d["block"], d["reason"]) for d in quick["damaged"]] == [(1, 0, reasons[0])]


def test_verify_finds_missing_blocks(built: dd.Built) -> None:
    cache = dd.Cache(built.lmdb_dir)
    try:
        from samplecache.format.record import record_key
        cache.writer.submit(lambda txn: txn.delete(record_key(2, 1), db=cache.dbs[b"records"])).result()
    finally:
        cache.close()
    proc = _verify(built.lmdb_dir.parent, "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["damaged"] == [{"shard": 2, "block": 1, "reason": "missing"}]


def test_verify_truncated_file_never_maps_it(built: dd.Built) -> None:
    os.truncate(built.lmdb_dir / "data.mdb", 8192)
    proc = _verify(built.lmdb_dir.parent)
    assert proc.returncode == 1, proc  # not -SIGBUS
    assert "truncated" in proc.stdout and "--reset-cache" in proc.stdout


def test_verify_without_a_cache_exits_2(tmp_path: Path) -> None:
    proc = _verify(tmp_path / "nothing")
    assert proc.returncode == 2 and "no samplecache cache" in proc.stderr, proc


def test_verify_beside_a_live_writer(built: dd.Built, tmp_path: Path) -> None:
    """Shards ingested and evicted while the scrub runs: no false damage, nothing missed that stays."""
    cache = dd.Cache(built.lmdb_dir)
    schema = built.schema
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        k = 10
        try:
            while not stop.is_set():
                path, _, _ = dd.stage(tmp_path / "staging", f"live{k}", dd.table(k, 40), schema, unit=k)
                cache.writer.ingest(path).result()
                oldest = min(s.id for s in cache.catalog.shards())
                cache.writer.submit(lambda txn, sid=oldest: cache.writer._delete(txn, [sid])).result()
                cache.catalog.removed_shard(oldest)
                k += 1
        except BaseException as e:  # reported by the test
            errors.append(e)

    t = threading.Thread(target=churn)
    t.start()
    try:
        runs = [_verify(built.lmdb_dir.parent, "--json") for _ in range(4)]
    finally:
        stop.set()
        t.join(60)
        cache.close()
    assert not errors, errors
    for proc in runs:
        assert proc.returncode == 0, proc
        report = json.loads(proc.stdout)
        assert report["clean"] and report["shards"] + report["evicted"] == report["shards_total"], report
