"""The daemon's image (deploy/Dockerfile), built and run with podman as root: non-root user, read-only root file
system and no capabilities (as deploy/k8s runs it), HEALTHCHECK, /healthz from the host through a port published on
loopback, the cache in a host directory shared with a client on the host.

How the image is built here (a base made from Debian packages, no registry), the runtime choices for this host, and
when the tests skip: tests/support/podman_tools.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from deploy_tools import free_port, get, run
from podman_tools import daemon_image, podman_command, ulimits

pytestmark = pytest.mark.e2e

UID = 10001  # the image's user (deploy/Dockerfile)
ROWS, FILES = 4000, 2


@pytest.fixture(scope="module")
def podman() -> list[str]:
    return podman_command()


@pytest.fixture(scope="module")
def image(podman: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    return daemon_image(podman, tmp_path_factory.mktemp("build"))


def write_dataset(data: Path) -> Any:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    data.mkdir()
    tables = []
    for i in range(FILES):
        t = pa.table({"id": np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64),
                      "x": np.random.default_rng(i).standard_normal(ROWS).astype(np.float32),
                      "s": [f"row-{i * ROWS + j}" for j in range(ROWS)]})
        pq.write_table(t, data / f"part-{i}.parquet", row_group_size=1000)
        tables.append(t)
    data.chmod(0o755)
    return pa.concat_tables(tables)


@pytest.fixture(scope="module")
def daemon(podman: list[str], image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The daemon container: dataset mounted read-only, the cache a host directory mounted at the same path inside (the
    manifests name the LMDB path, which the host client opens), the API published on 127.0.0.1 only."""
    root = tmp_path_factory.mktemp("container")
    root.chmod(0o755)  # the image's user walks down to the cache dir
    table = write_dataset(root / "data")
    cache = root / "cache"
    cache.mkdir(mode=0o750)
    os.chown(cache, UID, UID)
    port, name = free_port(), f"samplecache-test-{os.getpid()}"
    cmd = [*podman, "run", "--detach", "--name", name, *ulimits(), "--stop-timeout", "15",
           # as deploy/k8s/daemonset.yaml runs it: read-only root (podman mounts a tmpfs on /tmp), no capabilities
           "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
           "--publish", f"127.0.0.1:{port}:8750",
           "--volume", f"{root / 'data'}:/data:ro", "--volume", f"{cache}:{cache}",
           "--env", f"SAMPLECACHE_CACHE_DIR={cache}",
           image, "--source", "file:///data", "--max-bytes", "64MiB", "--samplers", "2"]
    t0 = time.monotonic()
    r = run(cmd)
    assert r.returncode == 0, r.stderr
    d = {"name": name, "url": f"http://127.0.0.1:{port}", "cache": cache, "table": table, "podman": podman}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                d["healthz"] = get(d["url"] + "/healthz")
                break
            except OSError:
                state = run([*podman, "inspect", "--format", "{{.State.Status}}", name]).stdout.strip()
                assert state == "running" and time.monotonic() < deadline, (
                    f"container {state}, no /healthz:\n{run([*podman, 'logs', name]).stdout[-5000:]}")
                time.sleep(0.3)
        d["start_seconds"] = time.monotonic() - t0
        yield d
    finally:
        logs = run([*podman, "logs", name])
        if os.environ.get("SAMPLECACHE_TEST_VERBOSE"):
            print(logs.stdout[-5000:], logs.stderr[-5000:], file=sys.stderr)
        run([*podman, "rm", "--force", "--volumes", name])  # and the anonymous volume of VOLUME


def test_image_runs_the_daemon_as_non_root_without_torch(podman: list[str], image: str, daemon: dict[str, Any]) -> None:
    config = json.loads(run([*podman, "image", "inspect", image]).stdout)[0]["Config"]
    assert config["User"] == f"{UID}:{UID}"
    top = run([*podman, "top", daemon["name"], "user", "args"])
    assert top.returncode == 0, top.stderr
    daemon_lines = [ln for ln in top.stdout.splitlines() if "samplecache serve" in ln]
    assert daemon_lines and all(ln.split()[0] in ("samplecache", str(UID)) for ln in daemon_lines), top.stdout
    owners = {p.stat().st_uid for p in daemon["cache"].rglob("*")}
    assert owners == {UID}, f"files in the shared cache dir owned by {owners}"
    probe = run([*podman, "exec", daemon["name"], "python", "-c",
                 "import importlib.util as u, s3fs; print(u.find_spec('torch') is None)"])
    assert probe.stdout.strip() == "True", probe.stdout + probe.stderr  # the s3 extra is in, torch is not


def test_healthz_from_the_host_on_loopback_only(podman: list[str], daemon: dict[str, Any]) -> None:
    assert daemon["healthz"][0] == 200
    ports = run([*podman, "port", daemon["name"]]).stdout.split()
    assert ports and all(p.startswith("127.0.0.1:") for p in ports if ":" in p), ports


def test_image_healthcheck_passes(podman: list[str], image: str, daemon: dict[str, Any]) -> None:
    inspected = json.loads(run([*podman, "image", "inspect", image]).stdout)[0]
    health = inspected.get("Healthcheck") or inspected["Config"].get("Healthcheck")  # podman | docker
    assert health, "the image has no HEALTHCHECK (built without --format docker?)"
    assert "/healthz" in " ".join(health["Test"]), health
    r = run([*podman, "healthcheck", "run", daemon["name"]])
    assert r.returncode == 0, f"healthcheck failed: {r.stdout}{r.stderr}"
    state = json.loads(run([*podman, "inspect", daemon["name"]]).stdout)[0]["State"]
    health_state = state.get("Health") or state.get("Healthcheck")
    assert health_state["Status"] == "healthy", health_state


def test_host_client_reads_through_the_shared_cache(daemon: dict[str, Any]) -> None:
    """The samplecache client of this venv: manifest and lease over HTTP, samples from the LMDB files the container
    wrote into the shared directory."""
    import numpy as np

    from samplecache import SampleCacheDataset

    table = daemon["table"]
    expected = dict(zip(table.column("id").to_pylist(), table.column("x").to_numpy()))
    # the manifests name <cache dir>/lmdb: the same path on the host, where the client opens it
    assert json.loads(get(daemon["url"] + "/v1/status")[1])["cache_dir"] == str(daemon["cache"])
    with SampleCacheDataset(daemon["url"], min_samples=table.num_rows, wait=120, shuffle=False) as ds:
        rows = [(int(s["id"]), float(s["x"]), s["s"]) for s in ds]
    assert sorted(i for i, _, _ in rows) == sorted(expected), "every row exactly once"
    assert all(np.float32(x) == expected[i] and s == f"row-{i}" for i, x, s in rows)


def test_stops_cleanly_within_the_grace_period(podman: list[str], daemon: dict[str, Any]) -> None:
    t0 = time.monotonic()
    r = run([*podman, "stop", "--time", "15", daemon["name"]])
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    code = run([*podman, "inspect", "--format", "{{.State.ExitCode}}", daemon["name"]]).stdout.strip()
    assert code == "0", run([*podman, "logs", daemon["name"]]).stdout[-5000:]
    assert took < 10, f"took {took:.1f} s to stop; the image allows 15"
