"""The daemon's image (deploy/Dockerfile), built and run with podman as root: non-root user, HEALTHCHECK, /healthz
from the host through a port published on loopback, the cache in a host directory shared with a client on the host.

Base image. No image registry is reachable from CI, so the tests build the base from Debian packages with
deploy/debian-base.sh (debootstrap) and pass it as ``--build-arg BASE=``. It stays in podman's image store
(/var/lib/containers/storage), tagged by the script's hash: later runs reuse it, a changed script makes a new one. The
image's layers are podman's build cache: the dependencies' layer is rebuilt only when pyproject.toml changes, a code
change rebuilds a wheel and one small layer. pip in the build goes through the host's network (``--network host``),
trusts the host's CA bundle (Debian's pip reads /etc/ssl/certs) and uses the host's http(s) package index if pip is
configured with one.

Runtime choices for this kind of host (a VM with cgroup v1 plus a v2 "unified" hierarchy; root without
CAP_SYS_RESOURCE): runc, since crun refuses hybrid cgroups; explicit ulimits no higher than this process's hard
limits, since podman's defaults ask for more than root may set here.

Where podman cannot run, the tests skip and say why; SAMPLECACHE_TEST_PODMAN=require (scripts/test.sh sets it once it
has installed podman) turns that into a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from deploy_tools import DEPLOY, REPO, free_port, get, run

pytestmark = pytest.mark.e2e

BASE_SCRIPT = DEPLOY / "debian-base.sh"
BASE_REPO = "localhost/samplecache-base"
IMAGE = "localhost/samplecache:test"
UID = 10001  # the image's user (deploy/Dockerfile)
ROWS, FILES = 4000, 2
INSTALL_PODMAN = "apt-get install podman runc debootstrap"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def unavailable(reason: str) -> None:
    if os.environ.get("SAMPLECACHE_TEST_PODMAN") == "require":
        pytest.fail(f"{reason} (SAMPLECACHE_TEST_PODMAN=require)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def podman() -> list[str]:
    """The podman command line, with runc where it is installed; skips (or fails, see above) without podman."""
    exe = shutil.which("podman")
    if exe is None:
        unavailable(f"podman is not installed ({INSTALL_PODMAN})")
    cmd = [exe, "--runtime", "runc"] if shutil.which("runc") else [exe]
    r = run([*cmd, "info", "--format", "json"])
    if r.returncode != 0:
        unavailable(f"podman cannot run here: {r.stderr.strip()[-2000:]}")
    if json.loads(r.stdout)["host"]["security"].get("rootless"):
        unavailable("these tests run podman as root (the cache dir is chowned to the image's user)")
    return cmd


def ulimits() -> list[str]:
    """nofile and nproc within this process's hard limits (the unit asks for 65536 open files)."""
    nofile = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    nproc = min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[1])
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def image_id(podman: list[str], ref: str) -> str | None:
    r = run([*podman, "image", "inspect", "--format", "{{.Id}}", ref])
    return r.stdout.strip() if r.returncode == 0 else None


@pytest.fixture(scope="module")
def base_image(podman: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Debian-built base, made once per version of deploy/debian-base.sh."""
    tag = f"{BASE_REPO}:bookworm-{hashlib.sha256(BASE_SCRIPT.read_bytes()).hexdigest()[:12]}"
    if image_id(podman, tag):
        return tag
    if shutil.which("debootstrap") is None:
        unavailable(f"no base image {tag} and no debootstrap to build it ({INSTALL_PODMAN})")
    env = {**os.environ, "TMPDIR": str(tmp_path_factory.mktemp("base")), "ENGINE": podman[0]}
    r = run(["bash", str(BASE_SCRIPT), tag], timeout=900, env=env)
    assert r.returncode == 0, f"deploy/debian-base.sh failed:\n{r.stdout}\n{r.stderr}"
    for line in run([*podman, "images", "--format", "{{.Repository}}:{{.Tag}}", BASE_REPO]).stdout.split():
        if line != tag:  # bases of older versions of the script
            run([*podman, "rmi", line])
    return tag


def pip_options(where: Path) -> list[str]:
    """`podman build` options that give pip in the build this host's CA bundle and http(s) package index."""
    r = run([sys.executable, "-m", "pip", "config", "list"])
    conf: dict[str, str] = {}
    for line in r.stdout.splitlines():  # global.index-url='https://...'  :env:.extra-index-url='...'
        key, _, value = line.partition("=")
        name, value = key.rpartition(".")[2], value.strip("'\"")
        if name in ("index-url", "extra-index-url"):
            urls = [u for u in value.split() if u.startswith(("http://", "https://"))]  # file:// is not in the build
            if urls:
                conf[name] = " ".join(urls)
        elif name == "trusted-host":
            conf[name] = value
    opts = ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.is_file() else []
    if conf:
        (where / "pip.conf").write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))
        opts += ["-v", f"{where / 'pip.conf'}:/etc/pip.conf:ro"]
    return opts


@pytest.fixture(scope="module")
def image(podman: list[str], base_image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    before = image_id(podman, IMAGE)
    cmd = [*podman, "build", "--format", "docker",  # the docker format keeps HEALTHCHECK (OCI has none)
           "--network", "host", *ulimits(), *pip_options(tmp_path_factory.mktemp("build")),
           "--build-arg", f"BASE={base_image}", "-f", str(DEPLOY / "Dockerfile"),
           "--ignorefile", str(DEPLOY / "Dockerfile.dockerignore"), "-t", IMAGE, str(REPO)]
    r = run(cmd, timeout=900)
    assert r.returncode == 0, f"podman build failed:\n{r.stdout[-10000:]}\n{r.stderr[-5000:]}"
    if before and before != image_id(podman, IMAGE):
        run([*podman, "rmi", before])  # the previous build, untagged now; its layers stay cached
    return IMAGE


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
