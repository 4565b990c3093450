"""ops/health.py: what /healthz and /v1/status say of the daemon's threads never shows a credential."""

from __future__ import annotations

from samplecache_service.ops.health import Health

URL = "http://reader:Pa55w0rd-sentinel@127.0.0.1:8000/data/part-0.parquet"


def test_a_failure_about_a_remote_path_is_shown_with_its_credentials_masked() -> None:
    health = Health(fatal_after=3600.0)
    health.add_check("samplers", lambda: f"a sampler died reading {URL}")
    health.failed("scheduler", KeyError(URL))
    shown = " ".join(health.problems()) + repr(health.snapshot())
    assert "Pa55w0rd-sentinel" not in shown, shown
    assert "http://***@127.0.0.1:8000/data/part-0.parquet" in shown and "scheduler thread failing" in shown, shown
