"""podman for the container tests (test_container.py, test_compose.py): the command line, the Debian-built base image,
image builds that reach this host's package index, the limits this host allows.

Base image. No image registry is reachable from CI, so the base is built from Debian packages with
deploy/debian-base.sh (debootstrap) and passed as ``--build-arg BASE=``. It stays in podman's image store
(/var/lib/containers/storage), tagged by the script's hash: later runs reuse it, a changed script makes a new one.
Image layers are podman's build cache. pip in a build goes through the host's network (``--network host``), trusts the
host's CA bundle (Debian's pip reads /etc/ssl/certs) and uses the host's http(s) package index if pip is configured
with one.

Runtime choices for this kind of host (a VM with cgroup v1 plus a v2 "unified" hierarchy; root without
CAP_SYS_RESOURCE): runc, since crun refuses hybrid cgroups; explicit ulimits no higher than this process's hard limits,
since podman's defaults ask for more than root may set here.

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
from pathlib import Path

import pytest
from deploy_tools import DEPLOY, REPO, run

BASE_SCRIPT = DEPLOY / "debian-base.sh"
BASE_REPO = "localhost/samplecache-base"
IMAGE = "localhost/samplecache:test"  # deploy/Dockerfile, as the tests build it
INSTALL_PODMAN = "apt-get install podman runc debootstrap"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_TIMEOUT = 900


def unavailable(reason: str) -> None:
    if os.environ.get("SAMPLECACHE_TEST_PODMAN") == "require":
        pytest.fail(f"{reason} (SAMPLECACHE_TEST_PODMAN=require)")
    pytest.skip(reason)


def podman_command() -> list[str]:
    """The podman command line, with runc where it is installed; skips (or fails, see above) without podman."""
    exe = shutil.which("podman")
    if exe is None:
        unavailable(f"podman is not installed ({INSTALL_PODMAN})")
    assert exe is not None
    cmd = [exe, "--runtime", "runc"] if shutil.which("runc") else [exe]
    r = run([*cmd, "info", "--format", "json"])
    if r.returncode != 0:
        unavailable(f"podman cannot run here: {r.stderr.strip()[-2000:]}")
    if json.loads(r.stdout)["host"]["security"].get("rootless"):
        unavailable("these tests run podman as root (cache dirs are chowned to the image's user)")
    return cmd


def limits() -> dict[str, int]:
    """nofile and nproc within this process's hard limits (the unit asks for 65536 open files)."""
    return {"nofile": min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
            "nproc": min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[1])}


def ulimits() -> list[str]:
    return [a for name, n in limits().items() for a in ("--ulimit", f"{name}={n}:{n}")]


def image_id(podman: list[str], ref: str) -> str | None:
    r = run([*podman, "image", "inspect", "--format", "{{.Id}}", ref])
    return r.stdout.strip() if r.returncode == 0 else None


def base_image(podman: list[str], workdir: Path) -> str:
    """The Debian-built base, made once per version of deploy/debian-base.sh."""
    tag = f"{BASE_REPO}:bookworm-{hashlib.sha256(BASE_SCRIPT.read_bytes()).hexdigest()[:12]}"
    if image_id(podman, tag):
        return tag
    if shutil.which("debootstrap") is None:
        unavailable(f"no base image {tag} and no debootstrap to build it ({INSTALL_PODMAN})")
    env = {**os.environ, "TMPDIR": str(workdir), "ENGINE": podman[0]}
    r = run(["bash", str(BASE_SCRIPT), tag], timeout=BUILD_TIMEOUT, env=env)
    assert r.returncode == 0, f"deploy/debian-base.sh failed:\n{r.stdout}\n{r.stderr}"
    for line in run([*podman, "images", "--format", "{{.Repository}}:{{.Tag}}", BASE_REPO]).stdout.split():
        if line != tag:  # bases of older versions of the script
            run([*podman, "rmi", line])
    return tag


def pip_config() -> dict[str, str]:
    """This interpreter's pip configuration (files and PIP_* variables): name -> value, the last one set wins."""
    r = run([sys.executable, "-m", "pip", "config", "list"])
    conf: dict[str, str] = {}
    for line in r.stdout.splitlines():  # global.index-url='https://...'  :env:.extra-index-url='...'
        key, _, value = line.partition("=")
        conf[key.rpartition(".")[2]] = value.strip("'\"")
    return conf


def pip_options(workdir: Path) -> list[str]:
    """`podman build` options that give pip in the build this host's CA bundle and http(s) package index."""
    conf: dict[str, str] = {}
    for name, value in pip_config().items():
        if name in ("index-url", "extra-index-url"):
            urls = [u for u in value.split() if u.startswith(("http://", "https://"))]  # file:// is not in the build
            if urls:
                conf[name] = " ".join(urls)
        elif name == "trusted-host":
            conf[name] = value
    opts = ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.is_file() else []
    if conf:
        (workdir / "pip.conf").write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))
        opts += ["-v", f"{workdir / 'pip.conf'}:/etc/pip.conf:ro"]
    return opts


def build(podman: list[str], tag: str, dockerfile: Path, context: Path, workdir: Path, *options: str) -> str:
    """``podman build`` in the docker format (it keeps HEALTHCHECK; OCI has none); the untagged previous build is
    removed (its layers stay cached)."""
    before = image_id(podman, tag)
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    cmd = [*podman, "build", "--format", "docker", "--network", "host", *ulimits(), *pip_options(workdir),
           *options, "-f", str(dockerfile), *(["--ignorefile", str(ignore)] if ignore.is_file() else []),
           "-t", tag, str(context)]
    r = run(cmd, timeout=BUILD_TIMEOUT)
    assert r.returncode == 0, f"podman build of {tag} failed:\n{r.stdout[-10000:]}\n{r.stderr[-5000:]}"
    if before and before != image_id(podman, tag):
        run([*podman, "rmi", before])
    return tag


def daemon_image(podman: list[str], workdir: Path) -> str:
    """deploy/Dockerfile built on the Debian base."""
    base = base_image(podman, workdir)
    return build(podman, IMAGE, DEPLOY / "Dockerfile", REPO, workdir, "--build-arg", f"BASE={base}")
