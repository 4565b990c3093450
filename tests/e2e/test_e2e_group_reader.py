"""End to end: a trainer that is only in the cache's group reads it, whatever the umask the daemon started under
(README "Files and secrets": dirs 0750, LMDB's two files 0660).

Under umask 022 (a shell, the container image) LMDB used to make lock.mdb 0640: a reader in the group could not
take its reader slot and failed with ``lmdb.ReadonlyError``. Here the daemon (root, so its group is gid 0) makes
its cache under umask 022 and 077; then a reader with a uid and gid that own nothing, and the daemon's group as
its only other group (``setpriv``), reads a batch through the client, token file included.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

pytestmark = pytest.mark.e2e

NOBODY = 65534  # a uid and gid that own nothing here
READER = """
import sys
from samplecache.arrays import NumpyBatches

batches = NumpyBatches(sys.argv[1], batch_size=8, columns=["id"])
batch = next(iter(batches))
print("read", len(batch["id"]))
batches.close()
"""


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A dir any user may pass through, removed at the end. The temp dirs above it may be 0700 (pytest's root,
    scripts/test.sh's private TMPDIR): those get g+x and o+x for the test (the reader is in their group, and a
    group that matches is all Unix checks), and their modes back after it."""
    d = Path(tempfile.mkdtemp(prefix="samplecache-group-"))
    os.chmod(d, 0o711)
    opened: list[tuple[Path, int]] = []
    for parent in d.parents:
        mode = stat.S_IMODE(parent.stat().st_mode)
        if mode & (stat.S_IXGRP | stat.S_IXOTH) != stat.S_IXGRP | stat.S_IXOTH:
            opened.append((parent, mode))
            os.chmod(parent, mode | stat.S_IXGRP | stat.S_IXOTH)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
        for parent, mode in reversed(opened):
            os.chmod(parent, mode)


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask022", "umask077"])
def test_a_reader_only_in_the_group_reads_the_cache(daemon: Any, open_dir: Path, get: Callable[..., Any],
                                                    until: Callable[..., Any], umask: int) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the reader as another user")
    cache = open_dir / "cache"
    old = os.umask(umask)  # the daemon inherits it
    try:
        d = daemon(cache_dir=cache, samplers=1)
    finally:
        os.umask(old)
    until(lambda: get(d.url + "/v1/status").json()["shards"] > 0, 60, "a first shard")
    lmdb_dir = cache / "lmdb"
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode))
             for p in (cache, lmdb_dir, lmdb_dir / "data.mdb", lmdb_dir / "lock.mdb", cache / "api-token")}
    assert modes == {"cache": "0o750", "lmdb": "0o750", "data.mdb": "0o660", "lock.mdb": "0o660",
                     "api-token": "0o640"}, modes
    gid = cache.stat().st_gid
    assert gid != NOBODY and all(p.stat().st_uid != NOBODY for p in cache.rglob("*"))
    reader = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={gid}",
              sys.executable, "-c", READER, d.url]
    p = subprocess.run(reader, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(open_dir)}, cwd=open_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[-2:] == ["read", "8"], p.stdout
