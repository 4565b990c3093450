"""CPU time for benchmarks/ingest/main.py, two ways: the whole machine's (``/proc/stat``), and that of exactly the
processes involved (a process tree's ``utime + stime`` from ``/proc/<pid>/stat``), which other work on a shared
machine does not disturb.

A tree's CPU time is the sum over its live processes of their own time plus the time of their children already
reaped (``cutime + cstime``, counted in the parent that waited for them), so a sampler that exits between two
snapshots is still counted once. Threads are included (``/proc/<pid>/stat`` covers every thread).
multiprocessing's resource tracker (a helper process of the spawn context) is left out.

The samplers' start-up (a spawned interpreter, the sampler's imports, s3fs and its first connection) is not part
of the ingest, as the raw readers' is not part of the read: ``startup_cpu_s`` measures it in a process that does
just that, and the ingest's figure leaves it out (see ingest_daemon.ingest_run).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

TICK = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores, every process: the S3 server included)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICK


def _stat(pid: int | str, task: str = "") -> list[str] | None:
    """The fields of /proc/<pid>[/task/<tid>]/stat after the command name (field 3 is index 0)."""
    try:
        with open(f"/proc/{pid}{task}/stat") as f:
            text = f.read()
    except OSError:  # gone meanwhile
        return None
    return text[text.rindex(")") + 2:].split()


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(name)
            if st is not None:
                kids.setdefault(int(st[1]), []).append(int(name))
    return kids


def _helper(pid: int) -> bool:
    """multiprocessing's resource tracker (not a sampler)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"resource_tracker" in f.read()
    except OSError:
        return False


def tree_pids(root: int) -> list[int]:
    """``root`` and every live descendant but multiprocessing's resource tracker."""
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        if pid != root and _helper(pid):
            continue
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def tree_cpu_s(root: int) -> dict[str, float]:
    """CPU seconds of ``root``'s tree: ``root`` (its own threads), its descendants (live ones and the ones
    reaped), and the total."""
    own = desc = 0.0
    for pid in tree_pids(root):
        st = _stat(pid)
        if st is None:
            continue
        self_s = (int(st[11]) + int(st[12])) / TICK  # utime, stime
        reaped = (int(st[13]) + int(st[14])) / TICK  # cutime, cstime
        if pid == root:
            own, desc = self_s, desc + reaped
        else:
            desc += self_s + reaped
    return {"own": own, "descendants": desc, "total": own + desc}


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` (to see one thread, such as the LMDB writer, saturated)."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        st = _stat(pid, f"/task/{tid}")
        if st is not None:
            out[int(tid)] = (int(st[11]) + int(st[12])) / TICK
    return out


def self_cpu_s() -> float:
    """This process's own CPU seconds (a raw reader reports its own usage)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _startup(url: str, path: str, row_group: int, staging: str, env: Mapping[str, str], q: Any) -> None:
    """A sampler's life up to warm, then one more unit: CPU seconds after its first unit and after its second
    (the same unit twice), or only after the imports and the first connection when run_task cannot be called."""
    try:
        os.environ.update(env)
        importlib.import_module("samplecache_service.sampling.supervisor")  # what a sampler process imports
        from samplecache_service.remote.stores import FsspecRemote

        remote = FsspecRemote(url, {})
        remote.fs.cat_file(path, start=0, end=8)  # s3fs, botocore, the first connection
        connected = self_cpu_s()
        try:
            from samplecache_service.remote.columns import infer_schema
            from samplecache_service.sampling.sampler import SampleTask, run_task

            schema = infer_schema(remote.file_info(path)[1])[0].to_json()
            after = []
            for key in ("startup-1", "startup-2"):
                r = run_task(SampleTask(key=key, source=url, storage_options={}, path=path, row_group=row_group,
                                        schema=schema, staging_dir=staging, block_bytes=1 << 20))
                if not r.ok:
                    raise RuntimeError(r.error)
                after.append(self_cpu_s())
            q.put(("units", 2 * after[0] - after[1]))  # first unit = start-up + u, second = start-up + 2u
        except Exception as e:  # noqa: BLE001 - the daemon's internals changed: the imports and connection only
            q.put(("connected", connected, f"{type(e).__name__}: {e}"))
    except BaseException as e:
        q.put(("error", f"{type(e).__name__}: {e}"))


def startup_cpu_s(url: str, unit: tuple[str, int, int, int], staging: Path, env: Mapping[str, str],
                  runs: int = 3) -> dict[str, Any]:
    """CPU seconds of one sampler's start-up, median of ``runs`` spawned processes: the interpreter, the
    sampler's imports, s3fs and its first connection, and the first-use costs of its first unit (measured as
    the first unit's CPU less the same unit's again)."""
    ctx = mp.get_context("spawn")
    got, how = [], "first unit less the second"
    for i in range(runs):
        q = ctx.Queue()
        d = staging / f"startup-{i}"
        d.mkdir(parents=True, exist_ok=True)
        p = ctx.Process(target=_startup, args=(url, unit[0], unit[3], str(d), dict(env), q))
        p.start()
        r = q.get(timeout=120)
        p.join(timeout=30)
        if r[0] == "error":
            raise RuntimeError(f"start-up probe failed: {r[1]}")
        if r[0] == "connected":
            how = f"imports and first connection only (run_task: {r[2]})"
        got.append(r[1])
    return {"seconds": statistics.median(got), "runs": got, "how": how}


@dataclass
class Snapshot:
    """The CPU clocks at one instant: the machine, the S3 server's tree, optionally the daemon's tree and its
    main process's threads."""
    machine: float
    server: float
    daemon: dict[str, float] | None = None
    threads: dict[int, float] | None = None
    at: float = 0.0  # time.monotonic()

    @classmethod
    def take(cls, server_pid: int, daemon_pid: int | None = None) -> "Snapshot":
        d = tree_cpu_s(daemon_pid) if daemon_pid is not None else None
        th = thread_cpu_s(daemon_pid) if daemon_pid is not None else None
        return cls(machine_busy_s(), tree_cpu_s(server_pid)["total"], d, th, time.monotonic())


def spent(a: Snapshot, b: Snapshot) -> dict[str, float]:
    """CPU seconds between two snapshots: machine, server, and (when taken) the daemon's main process, its
    descendants (the samplers), and its busiest thread."""
    out = {"machine": b.machine - a.machine, "server": b.server - a.server}
    if a.daemon is not None and b.daemon is not None:
        out["daemon_main"] = b.daemon["own"] - a.daemon["own"]
        out["samplers"] = b.daemon["descendants"] - a.daemon["descendants"]
        out["daemon_tree"] = out["daemon_main"] + out["samplers"]
    if a.threads is not None and b.threads is not None:
        out["busiest_thread"] = max((v - a.threads.get(t, 0.0) for t, v in b.threads.items()), default=0.0)
    return out
