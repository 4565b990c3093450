"""deploy/k8s: the manifests against offline Kubernetes schemas, and the contract between them and the daemon.

- ``kubernetes-validate --strict`` (pip, in the test extra; its schemas ship with it) over every manifest, for the
  oldest and the newest Kubernetes version we claim. It has no schema for the Prometheus Operator's PodMonitor (a
  CRD) and says so; the PodMonitor is checked against the pydantic models generated from the operator's CRDs
  (pip ``cloudcoil-models-prometheus-operator``), strictly: a key the model does not know fails.
- The ConfigMap's config file through the daemon's own loader (``samplecache config``), in the image's environment.
- The probes' paths and the scraped path exist in the daemon's OpenAPI; selectors match the DaemonSet's pods; the
  training pod mounts the same node directory at the same path, as the same uid.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import DEPLOY, INSTALL_TEST_EXTRA, console_script, run, tool

K8S = DEPLOY / "k8s"
# The oldest Kubernetes we claim (internalTrafficPolicy and sizeLimit are GA well before it) and the newest the
# installed kubernetes-validate knows.
OLDEST = "1.30.0"
CACHE_DIR = "/var/lib/samplecache"
DAEMON_UID = 10001


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> resource, from every manifest file but kustomization.yaml."""
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for doc in documents(path):
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def newest_version() -> str:
    from kubernetes_validate.utils import latest_version

    return str(latest_version())


@pytest.mark.parametrize("version", [OLDEST, "newest"])
def test_manifests_validate_strictly(version: str) -> None:
    version = newest_version() if version == "newest" else version
    files = sorted(str(p) for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    r = run([tool("kubernetes-validate", INSTALL_TEST_EXTRA), "--strict", "-k", version, *files])
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    passed = set(re.findall(r"passed for resource (\S+)", out))
    expected = {"namespace/samplecache", "configmap/samplecache-config", "daemonset/samplecache",
                "service/samplecache", "service/samplecache-metrics", "job/train-example"}
    assert expected <= passed, f"not validated: {sorted(expected - passed)}\n{out}"
    # The one resource it cannot check (no schema for a CRD): test_podmonitor_matches_the_operator_crd does.
    unchecked = re.findall(r"Couldn't find schema for kind (\S+)", out)
    assert unchecked == ["PodMonitor"], out


def test_strict_validation_catches_a_misspelt_field(tmp_path: Path) -> None:
    """The check above bites: an unknown key in the pod template is an error."""
    bad = tmp_path / "daemonset.yaml"
    bad.write_text((K8S / "daemonset.yaml").read_text().replace("readinessProbe:", "readynessProbe:", 1))
    r = run([tool("kubernetes-validate", INSTALL_TEST_EXTRA), "--strict", "-k", OLDEST, str(bad)])
    assert r.returncode != 0 and "readynessProbe" in r.stdout + r.stderr, r.stdout + r.stderr


def unknown_keys(given: Any, parsed: Any, where: str = "") -> list[str]:
    """Keys of ``given`` that did not survive the model (pydantic ignores unknown keys)."""
    if isinstance(given, dict):
        parsed = parsed if isinstance(parsed, dict) else {}
        out = [f"{where}.{k}" for k in given if k not in parsed]
        return out + [x for k in given if k in parsed for x in unknown_keys(given[k], parsed[k], f"{where}.{k}")]
    if isinstance(given, list) and isinstance(parsed, list):
        return [x for i, (g, p) in enumerate(zip(given, parsed)) for x in unknown_keys(g, p, f"{where}[{i}]")]
    return []


def test_podmonitor_matches_the_operator_crd(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    try:
        from cloudcoil.models.prometheus_operator.v1 import PodMonitor
    except ImportError:
        pytest.fail(f"cloudcoil-models-prometheus-operator is not installed: {INSTALL_TEST_EXTRA}")
    given = manifests[("PodMonitor", "samplecache")]
    model = PodMonitor.model_validate(given)  # types, required keys, patterns (interval: "30s")
    parsed = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert unknown_keys(given, parsed) == []
    with pytest.raises(Exception, match="interval"):
        bad = json.loads(json.dumps(given))
        bad["spec"]["podMetricsEndpoints"][0]["interval"] = "30 seconds"
        PodMonitor.model_validate(bad)


def test_kustomization_lists_the_deployable_manifests() -> None:
    kustomization = documents(K8S / "kustomization.yaml")[0]
    listed = set(kustomization["resources"])
    assert all((K8S / name).is_file() for name in listed), listed
    # the PodMonitor needs the operator's CRDs and the training job is an example: applied on their own
    others = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "podmonitor.yaml", "training-pod.yaml"}
    assert listed == others


def pod_spec(resource: dict[str, Any]) -> dict[str, Any]:
    return resource["spec"]["template"]["spec"]


def test_config_map_is_a_valid_daemon_config(manifests: dict[tuple[str, str], dict[str, Any]],
                                             tmp_path: Path) -> None:
    """The daemon's own loader reads the file as the pod has it: at the default path's name, in the image's env."""
    ds = pod_spec(manifests[("DaemonSet", "samplecache")])
    config_map = manifests[("ConfigMap", "samplecache-config")]
    container = ds["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    volume = next(v for v in ds["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == "samplecache-config"
    from samplecache_service.config.file import DEFAULT_CONFIG

    assert Path(mount["mountPath"]) / "samplecache.toml" == DEFAULT_CONFIG, "the daemon would not find its file"
    (tmp_path / "samplecache.toml").write_text(config_map["data"]["samplecache.toml"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAMPLECACHE_")}
    env.update(SAMPLECACHE_HOST="0.0.0.0", SAMPLECACHE_PORT="8750", SAMPLECACHE_CACHE_DIR=CACHE_DIR,  # the image's
               SAMPLECACHE_TOKEN="from-the-secret")
    r = subprocess.run([console_script(), "config", "--config", str(tmp_path / "samplecache.toml")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^source\s+\"s3://.*config ", r.stdout, re.M), r.stdout
    assert "from-the-secret" not in r.stdout


def test_probes_and_metrics_are_daemon_routes(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    from samplecache_service.config.settings import Settings
    from samplecache_service.http.app import create_app

    paths = set(create_app(Settings(source="file:///nowhere")).openapi()["paths"])
    container = pod_spec(manifests[("DaemonSet", "samplecache")])["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    scraped = manifests[("PodMonitor", "samplecache")]["spec"]["podMetricsEndpoints"][0]["path"]
    assert {"/readyz", "/healthz", scraped} <= paths and scraped == "/metrics"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8750}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    assert {"requests", "limits"} <= container["resources"].keys()


def test_selectors_reach_the_daemon_pods(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    ds = manifests[("DaemonSet", "samplecache")]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for name in ("samplecache", "samplecache-metrics"):
        svc = manifests[("Service", name)]
        assert svc["spec"]["selector"].items() <= labels.items(), name
        assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"http"}
    # trainers must reach the daemon on their own node: its manifests name files on that node
    assert manifests[("Service", "samplecache")]["spec"]["internalTrafficPolicy"] == "Local"
    assert manifests[("Service", "samplecache-metrics")]["spec"]["clusterIP"] == "None"
    assert manifests[("PodMonitor", "samplecache")]["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_training_pod_shares_the_node_cache(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    ds = pod_spec(manifests[("DaemonSet", "samplecache")])
    job = pod_spec(manifests[("Job", "train-example")])

    def cache_mount(spec: dict[str, Any], container: dict[str, Any]) -> tuple[str, str]:
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == CACHE_DIR)
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        return volume["hostPath"]["path"], mount["mountPath"]

    assert cache_mount(ds, ds["containers"][0]) == cache_mount(job, job["containers"][0]) == (CACHE_DIR, CACHE_DIR)
    assert ds["securityContext"]["runAsUser"] == job["securityContext"]["runAsUser"] == DAEMON_UID
    assert ds["securityContext"]["runAsNonRoot"] is True
    daemon = ds["containers"][0]["securityContext"]
    assert daemon["allowPrivilegeEscalation"] is False and daemon["capabilities"]["drop"] == ["ALL"]
    env = {e["name"]: e for e in job["containers"][0]["env"]}
    assert env["SAMPLECACHE_URL"]["value"].startswith("http://samplecache.samplecache.svc:")
    token_ref = env["SAMPLECACHE_TOKEN"]["valueFrom"]["secretKeyRef"]
    daemon_env = {e["name"]: e for e in ds["containers"][0]["env"]}
    assert daemon_env["SAMPLECACHE_TOKEN"]["valueFrom"]["secretKeyRef"] == token_ref
