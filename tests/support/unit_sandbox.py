"""The seccomp policy of a systemd unit, rebuilt with libseccomp from the unit's own lines and enforced on a command.

systemd is not PID 1 in CI, so a unit cannot be started; what it would enforce on the daemon can: its syscall filter
(SystemCallFilter=, SystemCallErrorNumber=), RestrictAddressFamilies=, MemoryDenyWriteExecute= and UMask=. Needs
``systemd-analyze`` (to expand the @sets as this systemd does) and the pip package ``pyseccomp``.
"""

from __future__ import annotations

import json
import socket
import sys
import textwrap
from pathlib import Path

import pytest
from deploy_tools import INSTALL_SYSTEMD, INSTALL_TEST_EXTRA, one, run, tool

# Runs in a fresh interpreter: loads the policy into the kernel, then execs the command.
# Mirrors systemd 252: an allow list with the filter's default action = SystemCallErrorNumber=,
# MemoryDenyWriteExecute= as mmap(W|X) / mprotect(X) / shmat(SHM_EXEC) refused,
# RestrictAddressFamilies= as socket() of other families refused, UMask= applied.
LAUNCHER = textwrap.dedent("""
    import errno, json, os, sys
    import pyseccomp as sc
    p = json.load(open(sys.argv[1]))
    deny = getattr(errno, p["errno"])
    f = sc.SyscallFilter(defaction=sc.ERRNO(deny))
    special = {"mmap", "mprotect", "pkey_mprotect", "shmat", "socket"}
    for name in p["allow"]:
        if name in special:
            continue
        try:
            f.add_rule(sc.ALLOW, name)
        except Exception:  # not a syscall of this architecture
            pass
    W, X, SHM_EXEC = 0x2, 0x4, 0o100000
    if p["mdwe"]:
        for prot in (0, W, X):
            f.add_rule(sc.ALLOW, "mmap", sc.Arg(2, sc.MASKED_EQ, W | X, prot))
        for name in ("mprotect", "pkey_mprotect"):
            f.add_rule(sc.ALLOW, name, sc.Arg(2, sc.MASKED_EQ, X, 0))
        f.add_rule(sc.ALLOW, "shmat", sc.Arg(2, sc.MASKED_EQ, SHM_EXEC, 0))
    else:
        for name in ("mmap", "mprotect", "pkey_mprotect", "shmat"):
            f.add_rule(sc.ALLOW, name)
    for fam in p["families"]:
        f.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.EQ, fam))
    f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.GT, max(p["families"])))
    f.load()
    os.umask(int(p["umask"], 8))
    os.execv(sys.argv[2], sys.argv[2:])
""")


def expand_syscall_set(name: str, cache: dict[str, set[str]]) -> set[str]:
    if not name.startswith("@"):
        return {name}
    if name not in cache:
        r = run([tool("systemd-analyze", INSTALL_SYSTEMD), "syscall-filter", "--no-pager", name])
        assert r.returncode == 0, r.stderr
        calls: set[str] = set()
        for line in r.stdout.splitlines()[1:]:
            item = line.strip()
            if item and not item.startswith("#"):
                calls |= expand_syscall_set(item, cache)
        cache[name] = calls
    return cache[name]



def write_policy(unit: dict[str, list[str]], path: Path) -> Path:
    """The unit's policy as JSON at ``path``, for LAUNCHER."""
    tool("systemd-analyze", INSTALL_SYSTEMD)
    try:
        import pyseccomp  # noqa: F401
    except ImportError:
        pytest.fail(f"pyseccomp is not installed: {INSTALL_TEST_EXTRA}")
    cache: dict[str, set[str]] = {}
    filters = unit["Service.SystemCallFilter"]
    assert not filters[0].startswith("~"), "expected an allow list first"
    allow: set[str] = set()
    for value in filters:  # systemd: allow lines add, "~" lines remove, in order
        deny = value.startswith("~")
        names = set().union(*(expand_syscall_set(n, cache) for n in value.lstrip("~").split()))
        allow = allow - names if deny else allow | names
    families = [getattr(socket, f) for f in one(unit, "Service.RestrictAddressFamilies").split()]
    policy = {
        "allow": sorted(allow),
        "errno": one(unit, "Service.SystemCallErrorNumber"),
        "mdwe": one(unit, "Service.MemoryDenyWriteExecute") == "yes",
        "families": families,
        "umask": one(unit, "Service.UMask"),
    }
    path.write_text(json.dumps(policy))
    return path


def sandboxed(policy: Path, *cmd: str) -> list[str]:
    """``cmd`` run under ``policy`` (the launcher execs it: same pid)."""
    return [sys.executable, "-c", LAUNCHER, str(policy), *cmd]


SMOKE = textwrap.dedent("""
    import errno, mmap, multiprocessing as mp, os, socket, sys, tempfile, threading, time, urllib.request

    def child(q):
        import numpy, pyarrow.parquet, lmdb  # the sampler subprocesses' imports
        q.put(os.getpid())

    def main():
        # the policy is really in force
        if os.environ["EXPECT_MDWE"] == "1":
            try:
                mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
                sys.exit("W+X mapping was allowed")
            except OSError:
                pass
        try:
            socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)
            sys.exit("AF_NETLINK socket was allowed")
        except OSError:
            pass
        import numpy as np, pyarrow as pa, pyarrow.parquet as pq, lmdb, fsspec, fastapi, uvicorn
        import samplecache_service.daemon, samplecache_service.http.app  # noqa: F401  the daemon's own modules
        d = tempfile.mkdtemp()
        pq.write_table(pa.table({"x": np.arange(20000, dtype=np.float32), "s": [str(i) for i in range(20000)]}),
                       f"{d}/a.parquet", row_group_size=5000)
        with fsspec.filesystem("file").open(f"{d}/a.parquet", "rb") as f:
            assert pq.ParquetFile(f).read_row_group(2).num_rows == 5000
        env = lmdb.open(f"{d}/db", map_size=1 << 26, max_readers=4096)
        with env.begin(write=True) as txn:
            txn.put(b"k", np.ones(1024, np.float32).tobytes())
        with env.begin(buffers=True) as txn:
            assert np.frombuffer(txn.get(b"k"), np.float32).sum() == 1024
        for method in ("fork", "spawn", "forkserver"):
            ctx = mp.get_context(method)
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start(); q.get(timeout=60); p.join(60)
            assert p.exitcode == 0, (method, p.exitcode)
        app = fastapi.FastAPI()
        app.get("/healthz")(lambda: {"ok": True})
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        t = threading.Thread(target=server.run, daemon=True); t.start()
        for _ in range(200):
            if server.started: break
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
        server.should_exit = True; t.join(10)
        env.close()
        import shutil; shutil.rmtree(d)  # nothing left in the temp dir
        print("SMOKE OK")

    if __name__ == "__main__":
        main()
""")
