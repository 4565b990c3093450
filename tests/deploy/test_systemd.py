"""The systemd units under deploy/: samplecache.service (one dataset) and the template samplecache@.service (one
instance per config file), and the sysusers file.

Needs ``systemd-analyze`` and ``systemd-sysusers`` (Debian package ``systemd``, scripts/test.sh installs it) and the
pip package ``pyseccomp``. A missing tool fails the test with the install hint.

systemd is not PID 1 here, so a unit cannot be started. What is checked instead, with the real tools:
- ``systemd-analyze verify`` of both units, the template as an instance (exit 0 AND empty stderr: bad keys are only
  warnings);
- ``systemd-analyze security --offline`` of both against a threshold just above today's score;
- the units' seccomp policy (tests/support/unit_sandbox.py) with the daemon's dependency stack, then the daemon
  itself started from the template's own ExecStart= (its --config file, its cache dir) under it; its ExecReload= line,
  run as systemd would run it, makes the daemon re-read the config file.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from deploy_tools import DEPLOY, INSTALL_SYSTEMD, console_script, free_port, get, one, run, tool, unit_directives
from unit_sandbox import SMOKE, sandboxed, write_policy

UNIT = DEPLOY / "samplecache.service"
TEMPLATE = DEPLOY / "samplecache@.service"
SYSUSERS = DEPLOY / "samplecache.sysusers"
INSTANCE = "imagenet"  # the instance the template is checked as

# `systemd-analyze security` prints the exposure as 0.0-10.0; --threshold takes tenths.
# Both units score 1.1 (systemd 252). Raise this only with a reason written next to it.
SECURITY_THRESHOLD = 11

CACHE_DIR = "/var/lib/samplecache"
BINARY = "/usr/local/bin/samplecache"
EXEC_START = {UNIT: f"{BINARY} serve", TEMPLATE: f"{BINARY} serve --config /etc/samplecache/%i.toml"}
EXEC_RELOAD = "/bin/kill -HUP $MAINPID"
# The lines of the template that name its instance; every other line is the single unit's.
INSTANCE_LINES = {
    "Unit.Description": ["samplecache %i - local LMDB sample cache of a remote Parquet dataset"],
    "Service.ExecStart": [EXEC_START[TEMPLATE]],
    "Service.Environment": [f"SAMPLECACHE_CACHE_DIR={CACHE_DIR}/%i", "PYTHONUNBUFFERED=1"],
    "Service.EnvironmentFile": ["-/etc/samplecache/%i.env"],
    "Service.StateDirectory": ["samplecache/%i"],
    "Service.WorkingDirectory": [f"{CACHE_DIR}/%i"],
}


def checkable(unit: Path, where: Path) -> Path:
    """A copy of ``unit`` in ``where`` whose only change is the path of the binary in ExecStart, and the name to check
    it by (the template as an instance: systemd-analyze loads samplecache@.service for samplecache@imagenet.service).

    verify fails on a missing ExecStart binary, and /usr/local/bin/samplecache exists only on an installed host. The
    copy points at the console script pip installed for this interpreter (same program, same arguments); every other
    line is the file as shipped, and the line replaced is pinned here so it cannot drift.
    """
    text = unit.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("ExecStart")]
    assert lines == [f"ExecStart={EXEC_START[unit]}"], (
        f"{unit.name}: expected ExecStart={EXEC_START[unit]}, found {lines}")
    (where / unit.name).write_text(text.replace(f"ExecStart={BINARY} ", f"ExecStart={console_script()} "))
    return where / unit.name.replace("@.", f"@{INSTANCE}.")  # verify/security use the file name as the unit name


@pytest.fixture(params=[UNIT, TEMPLATE], ids=lambda p: p.name)
def checkable_unit(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return checkable(request.param, tmp_path)


# --- the units as systemd reads them ---------------------------------------------------


def test_unit_verifies_cleanly(checkable_unit: Path) -> None:
    r = run([tool("systemd-analyze", INSTALL_SYSTEMD), "verify", str(checkable_unit)])
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", f"systemd-analyze verify warned:\n{r.stderr}"


def test_verify_reads_the_template_through_its_instance(tmp_path: Path) -> None:
    """The check above bites: a misspelt key in the template is a warning on the instance."""
    path = checkable(TEMPLATE, tmp_path)
    template = tmp_path / TEMPLATE.name
    template.write_text(template.read_text().replace("\nUMask=0007\n", "\nUMsak=0007\n"))
    r = run([tool("systemd-analyze", INSTALL_SYSTEMD), "verify", str(path)])
    assert "Unknown key 'UMsak'" in r.stderr, r.stderr


def test_unit_hardening_score(checkable_unit: Path) -> None:
    r = run([tool("systemd-analyze", INSTALL_SYSTEMD), "security", "--offline=true", "--no-pager",
             f"--threshold={SECURITY_THRESHOLD}", str(checkable_unit)])
    score = re.search(rf"Overall exposure level for {re.escape(checkable_unit.name)}: (\d+\.\d+)", r.stdout)
    assert score, r.stdout + r.stderr
    assert r.returncode == 0, (f"exposure {score.group(1)} is above {SECURITY_THRESHOLD / 10}: "
                               f"a sandboxing line was lost\n{r.stdout}")


@pytest.fixture(scope="module")
def unit() -> dict[str, list[str]]:
    return unit_directives(UNIT.read_text())


@pytest.fixture(scope="module")
def template() -> dict[str, list[str]]:
    return unit_directives(TEMPLATE.read_text())


def test_unit_contract(unit: dict[str, list[str]]) -> None:
    """What the score does not see: lifecycle, identity, paths shared with trainers."""
    def s(key: str) -> str:
        return one(unit, f"Service.{key}")

    assert s("Type") in ("exec", "simple")
    assert s("ExecReload") == EXEC_RELOAD  # run for real by test_reload_rereads_the_config_file
    assert s("Restart") == "on-failure"
    assert s("KillMode") == "mixed"
    assert s("TimeoutStopSec") == "15"  # the daemon stops within 10 s of SIGTERM
    assert int(s("LimitNOFILE")) >= 65536
    assert s("EnvironmentFile") == "-/etc/samplecache/samplecache.env"
    # Static user: DynamicUser= would put the cache under /var/lib/private (0700 root),
    # out of the trainers' reach.
    assert s("User") == "samplecache" and s("Group") == "samplecache"
    assert "Service.DynamicUser" not in unit
    assert s("StateDirectory") == "samplecache"
    assert s("StateDirectoryMode") == "0750"
    # Group rw for LMDB's lock file (trainers' reader slots), nothing for others.
    assert s("UMask") == "0007"
    env = dict(v.split("=", 1) for v in unit["Service.Environment"])
    assert env["SAMPLECACHE_CACHE_DIR"] == CACHE_DIR
    # The environment wins over the config file: host and port are left to the file.
    assert "SAMPLECACHE_HOST" not in env and "SAMPLECACHE_PORT" not in env
    assert s("ProtectSystem") == "strict"
    assert s("MemoryDenyWriteExecute") == "yes"
    assert s("CapabilityBoundingSet") == ""
    assert one(unit, "Install.WantedBy") == "multi-user.target"


def test_template_is_the_unit_per_instance(unit: dict[str, list[str]], template: dict[str, list[str]]) -> None:
    """Same hardening, lifecycle and identity as the single unit; its own config file, env file and cache dir."""
    differ = {k for k in unit.keys() | template.keys() if unit.get(k) != template.get(k)}
    assert differ <= INSTANCE_LINES.keys(), (
        f"lines that differ but name no instance: {sorted(differ - INSTANCE_LINES.keys())}")
    for key, values in INSTANCE_LINES.items():
        assert template.get(key) == values, f"{key}: {template.get(key)}"


def test_sysusers_creates_the_service_user(tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "sysusers.d" / "samplecache.conf"
    conf.parent.mkdir(parents=True)
    shutil.copy(SYSUSERS, conf)
    r = run([tool("systemd-sysusers", INSTALL_SYSTEMD), f"--root={tmp_path}"])
    assert r.returncode == 0, r.stderr
    passwd = {ln.split(":")[0]: ln.split(":") for ln in (tmp_path / "etc" / "passwd").read_text().splitlines()}
    groups = {ln.split(":")[0]: ln.split(":") for ln in (tmp_path / "etc" / "group").read_text().splitlines()}
    user = passwd["samplecache"]
    assert 0 < int(user[2]) < 1000, "must be a system user"
    assert user[3] == groups["samplecache"][2], "primary group must be samplecache"
    assert user[5] == CACHE_DIR
    assert user[6].endswith("nologin")


# --- the daemon under the units' sandbox -------------------------------------------------


@pytest.fixture(scope="module")
def seccomp_policy(template: dict[str, list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template's policy (the same lines as the single unit's: test_template_is_the_unit_per_instance)."""
    return write_policy(template, tmp_path_factory.mktemp("seccomp") / "policy.json")


def test_dependency_stack_runs_under_unit_seccomp(seccomp_policy: Path, tmp_path: Path) -> None:
    """MemoryDenyWriteExecute=yes and the syscall filter do not break numpy/pyarrow/lmdb/uvicorn."""
    script = tmp_path / "smoke.py"
    script.write_text(SMOKE)
    mdwe = json.loads(seccomp_policy.read_text())["mdwe"]
    r = run(sandboxed(seccomp_policy, sys.executable, str(script)), cwd=tmp_path,
            env={**os.environ, "EXPECT_MDWE": "1" if mdwe else "0"})
    assert r.returncode == 0 and "SMOKE OK" in r.stdout, (
        f"rc={r.returncode} (-31 = SIGSYS)\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")


def write_dataset(data: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    data.mkdir()
    for i in range(4):
        n = 4000
        pq.write_table(pa.table({"id": np.arange(i * n, (i + 1) * n, dtype=np.int64),
                                 "x": np.random.default_rng(i).standard_normal(n).astype(np.float32),
                                 "s": [f"row-{j}" for j in range(n)]}),
                       data / f"part-{i}.parquet", row_group_size=1000)


def wait_for(what: str, seconds: float, probe: Any) -> Any:
    """``probe()`` until it returns something true; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {seconds:.0f} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def instance_in_unit_sandbox(seccomp_policy: Path, template: dict[str, list[str]],
                             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """samplecache@imagenet as the template runs it: its ExecStart= (the config file /etc/samplecache/imagenet.toml),
    its Environment= (the cache dir /var/lib/samplecache/imagenet), its WorkingDirectory=, under its seccomp policy,
    W^X and UMask. /etc/samplecache, /var/lib and the binary are moved under the test's dir; nothing else changes."""
    root = tmp_path_factory.mktemp("instance")
    etc, var_lib = root / "etc-samplecache", root / "var-lib"

    def here(value: str) -> str:  # what systemd expands, then the paths moved under root
        value = value.replace("%i", INSTANCE).replace(BINARY, console_script())
        return value.replace("/etc/samplecache", str(etc)).replace("/var/lib", str(var_lib))

    write_dataset(root / "data")
    port = free_port()
    etc.mkdir()
    config = etc / f"{INSTANCE}.toml"
    toml = 'source = "{src}"\nmax_bytes = "{budget}"\nsamplers = 2\nport = {port}\n'
    config.write_text(toml.format(src=(root / "data").as_uri(), budget="64MiB", port=port))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAMPLECACHE_")}
    env.update(v.split("=", 1) for v in map(here, template["Service.Environment"]))
    cache = Path(env["SAMPLECACHE_CACHE_DIR"])
    assert cache == var_lib / here(one(template, "Service.StateDirectory")), "the cache must be the StateDirectory"
    cache.mkdir(parents=True)  # systemd makes the StateDirectory before ExecStart
    argv = shlex.split(here(one(template, "Service.ExecStart")))
    log = (root / "daemon.log").open("w+")
    proc = subprocess.Popen(sandboxed(seccomp_policy, *argv), stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=here(one(template, "Service.WorkingDirectory")))
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"port": port}

    def alive_get(path: str, timeout: float = 5.0) -> tuple[int, bytes] | None:
        assert proc.poll() is None, "daemon exited under the unit's sandbox"
        try:
            return get(base + path, timeout)
        except OSError:
            return None

    def reloaded() -> dict[str, Any] | None:
        got = alive_get("/v1/status")
        status = json.loads(got[1]) if got else {}
        return status if status.get("config", {}).get("reloads") else None

    try:
        out["healthz"] = wait_for("/healthz", 60, lambda: alive_get("/healthz"))[0]
        # Sealing epoch 0 with min_samples=1 needs the samplers (subprocesses) and the
        # ingester to have run. 503 = the source is still being discovered.
        deadline = time.monotonic() + 90
        while True:
            try:
                status, body = get(f"{base}/v1/epochs/0?min_samples=1&timeout=30", timeout=45)
                break
            except urllib.error.HTTPError as e:
                assert e.code == 503 and time.monotonic() < deadline, f"{e.code}: {e.read()!r}"
                time.sleep(1)
        out["manifest_status"], out["manifest"] = status, json.loads(body)
        lmdb_dir = cache / "lmdb"
        out["modes"] = {p.name: p.stat().st_mode & 0o777 for p in [lmdb_dir, *lmdb_dir.iterdir()]}
        # systemctl reload: a new budget in the file, then ExecReload= as systemd runs it ($MAINPID expanded).
        out["max_bytes_before"] = json.loads(get(f"{base}/v1/status")[1])["max_bytes"]
        config.write_text(toml.format(src=(root / "data").as_uri(), budget="48MiB", port=port))
        reload = run(shlex.split(one(template, "Service.ExecReload").replace("$MAINPID", str(proc.pid))))
        out["reload_rc"] = reload.returncode
        out["status_after_reload"] = wait_for("reload in /v1/status", 30, reloaded)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            out["returncode"] = proc.wait(15)
        except subprocess.TimeoutExpired:
            out["returncode"] = None
        out["stop_seconds"] = time.monotonic() - t0
    except BaseException:
        log.seek(0)
        print(log.read()[-20000:], file=sys.stderr)
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.seek(0)
        out["log"] = log.read()
        log.close()
    return out


def test_daemon_runs_and_stops_under_unit_sandbox(instance_in_unit_sandbox: dict[str, Any]) -> None:
    d = instance_in_unit_sandbox
    assert d["healthz"] == 200
    assert d["manifest_status"] == 200 and d["manifest"], d["log"][-5000:]
    assert d["returncode"] == 0, f"rc={d['returncode']}\n{d['log'][-5000:]}"
    assert d["stop_seconds"] < 10, f"took {d['stop_seconds']:.1f} s to stop; the unit allows 15"
    assert "Bad system call" not in d["log"] and "Operation not permitted" not in d["log"], d["log"][-5000:]


def test_reload_rereads_the_config_file(instance_in_unit_sandbox: dict[str, Any]) -> None:
    """ExecReload= sends SIGHUP; the daemon reads its --config file again and applies the new budget."""
    d = instance_in_unit_sandbox
    assert d["reload_rc"] == 0
    status = d["status_after_reload"]
    assert d["max_bytes_before"] == 64 << 20
    assert status["max_bytes"] == 48 << 20, status
    assert status["config"]["reloads"] == 1 and not status["config"]["last_error"], status["config"]
    assert status["config"]["file"].endswith(f"{INSTANCE}.toml"), status["config"]


def test_cache_is_readable_by_the_trainers_group(instance_in_unit_sandbox: dict[str, Any]) -> None:
    """Trainers (group members) open LMDB read-only with locks: lock.mdb needs g+rw, data.mdb g+r."""
    modes = instance_in_unit_sandbox["modes"]
    assert modes["lmdb"] & 0o050 == 0o050, oct(modes["lmdb"])
    assert modes["data.mdb"] & 0o040, oct(modes["data.mdb"])
    assert modes["lock.mdb"] & 0o060 == 0o060, (
        f"lock.mdb is {oct(modes['lock.mdb'])}: group readers cannot take a reader slot. "
        "Open the environment with lmdb.open(..., mode=0o770) (files 0660 under UMask=0007) "
        "or chmod lock.mdb g+rw after opening.")
    assert all(m & 0o007 == 0 for m in modes.values()), {k: oct(v) for k, v in modes.items()}
