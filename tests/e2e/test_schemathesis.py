"""Schemathesis over the running daemon's OpenAPI, with its token: generated requests to every operation
(valid ones and invalid ones), every check schemathesis has. No 5xx, and every reply (status, content type,
headers, body) is what the OpenAPI says. The daemon runs as a real ``samplecache serve`` subprocess; the
stateful changes the requests make (tiny budgets, paused samplers, released leases) stay on its own cache."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

pytestmark = pytest.mark.e2e

CASES = 1200  # generated requests, over all operations (at least 1,000)
BUDGET_S = 170  # the run must end well within ~3 minutes on a 2-core host


def _as_int(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _as_int(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_int(v) for v in value]
    return value


def _integers_as_integers(case: Any) -> Any:
    """JSON Schema counts 24126.0 as an integer; the daemon's strict bodies do not (``{"max_bytes": 9899.0}`` is a
    422 on purpose). A valid request writes its integers as integers (a float field takes them too)."""
    if isinstance(case.body, (dict, list, float)):
        case.body = _as_int(case.body)
    return case


def test_schemathesis_finds_no_server_error_and_no_schema_violation(daemon: Any, get: Any, until: Any) -> None:
    # short waits: a manifest request may ask for up to --epoch-wait-max seconds of warm-up
    d = daemon(samplers=1, extra=["--epoch-wait-max", "0.2", "--lease-ttl", "30"])
    until(lambda: get(d.url + "/v1/status").json()["samples"] > 0, 60, "a first shard")
    with urllib.request.urlopen(d.url + "/v1/epochs/0?min_samples=1&timeout=0.2", timeout=30) as r:
        assert r.status == 200  # one sealed epoch: leases and jobs have something to work on
    schema = schemathesis.openapi.from_url(d.url + "/openapi.json")
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) >= 15
    load_all_checks()
    checks = CHECKS.get_all()
    names = sorted(c.__name__ for c in checks)
    assert {"not_a_server_error", "status_code_conformance", "content_type_conformance",
            "response_schema_conformance", "response_headers_conformance", "negative_data_rejection",
            "positive_data_acceptance", "ignored_auth", "unsupported_method"} <= set(names), names
    strategy = st.one_of(schema.as_strategy(GenerationMode.POSITIVE).map(_integers_as_integers),
                         schema.as_strategy(GenerationMode.NEGATIVE))
    seen: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    t0 = time.monotonic()

    @settings(max_examples=CASES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case: Any) -> None:
        seen[f"{case.method} {case.path}"] += 1
        response = case.call_and_validate(headers=d.headers, checks=checks, timeout=30)
        statuses[response.status_code] += 1

    run()
    took = time.monotonic() - t0
    print(f"\nschemathesis: {sum(seen.values())} cases over {len(seen)} of {len(operations)} operations in "
          f"{took:.0f} s, {len(names)} checks ({', '.join(names)}); statuses {dict(sorted(statuses.items()))}; "
          f"per operation {json.dumps(dict(sorted(seen.items())))}")
    assert sum(seen.values()) >= 1000
    assert len(seen) == len(operations), sorted(seen)
    assert not [s for s in statuses if s >= 500], statuses
    assert took < BUDGET_S, f"took {took:.0f} s"
