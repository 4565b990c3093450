"""Module-level sampler targets for test_supervisor.py.

They run in ``spawn``-ed children, which unpickle the target by reference
(``supervisor_targets.<name>``), so this module must be importable there: the
child gets the parent's ``sys.path`` (pytest puts tests/support on it) and the test adds
tests/support to PYTHONPATH as well.
"""

from __future__ import annotations

import os
import time

# A new process cannot import this module while the file this variable names exists: a broken install under a
# running daemon (a broken pyarrow). The test process imported it before, so only new samplers die at start.
BROKEN_IMPORT = "SUPERVISOR_TARGETS_BROKEN_IMPORT"
if os.path.exists(os.environ.get(BROKEN_IMPORT, "/nonexistent")):
    raise ImportError("supervisor_targets: simulated broken install")

from samplecache_service.sampling.sampler import SampleResult, SampleTask  # noqa: E402


def make_task(key: str, path: str = "", row_group: int = 0) -> SampleTask:
    return SampleTask(key=key, source="memory://none", storage_options={}, path=path, row_group=row_group,
                      schema={}, staging_dir="/nonexistent", block_bytes=1 << 20)


def echo(task: SampleTask) -> SampleResult:
    """Succeeds; reports which process ran it."""
    return SampleResult(task=task, ok=True, rows=task.row_group, extra={"pid": os.getpid()})


def crash_or_echo(task: SampleTask) -> SampleResult:
    """``path == "crash"`` kills the worker mid-task with exit code 3; anything else succeeds."""
    if task.path == "crash":
        os._exit(3)
    return echo(task)


def sleep_then_echo(task: SampleTask) -> SampleResult:
    """Sleeps ``float(task.path)`` seconds (a slow remote read), then succeeds."""
    time.sleep(float(task.path or 0))
    return echo(task)


def close_fds_then_exit(task: SampleTask) -> SampleResult:
    """``path == "crash"``: close every inherited descriptor (the parent then sees the process sentinel and the
    pipe become ready at once), linger a moment, then exit with code 3. This widens, deterministically, the
    window between 'the sentinel fired' and 'the exit status can be read' that a real crash also has."""
    if task.path == "crash":
        os.closerange(3, 65536)
        time.sleep(0.3)
        os._exit(3)
    return echo(task)
