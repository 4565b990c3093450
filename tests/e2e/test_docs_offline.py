"""The API docs at /docs work with no internet: Swagger UI comes from the daemon
(service/samplecache_service/http/swagger_ui/, vendored with its licence), rendered in a real headless Chromium
in which no host name but 127.0.0.1 resolves. Every operation of the daemon's OpenAPI must be on the page, and
the page must ask nothing of any other origin.
/redoc is not served.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from chromium import Chromium
from paths import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.e2e

ASSETS = REPO / "service" / "samplecache_service" / "http" / "swagger_ui"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


def test_docs_render_every_operation_offline(daemon: Any, get: Callable[..., Any], tmp_path: Path) -> None:
    d = daemon(samplers=1)
    spec = get(d.url + "/openapi.json").json()
    operations = {(m.upper(), path) for path, item in spec["paths"].items() for m in item if m in METHODS}
    assert len(operations) >= 15, operations

    r = get(d.url + "/docs")
    assert r.status == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and not re.search(r"https?:|\*", csp), csp
    html = r.body.decode()
    assert "cdn." not in html and "https://" not in html, "the docs page names another origin"
    assert get(d.url + "/redoc").status == 404
    for name in ("LICENSE", "NOTICE"):  # the vendored assets' licence is served with them
        assert get(f"{d.url}/docs/assets/{name}").status == 200
    served = get(d.url + "/docs/assets/swagger-ui-bundle.js").body
    assert hashlib.sha256(served).hexdigest() in (ASSETS / "README.md").read_text(), "bundle differs from README"

    with Chromium(tmp_path / "chromium") as browser:  # offline: only 127.0.0.1 resolves
        page = browser.open(d.url + "/docs")
        page.wait_for(f"document.querySelectorAll('.opblock').length >= {len(operations)}", timeout=60)
        shown = page.eval("[...document.querySelectorAll('.opblock')].map(o => ["
                          "o.querySelector('.opblock-summary-method').textContent.trim(), "
                          "o.querySelector('.opblock-summary-path').dataset.path])")
        assert {(m, p) for m, p in shown} == operations, set(map(tuple, shown)) ^ operations
        assert "samplecache" in page.eval("document.querySelector('.info .title').textContent")
        assert page.eval("!!document.querySelector('.btn.authorize')"), "no Authorize button for the bearer token"

        requested = page.requests()
        assert requested and all(u.startswith(d.url + "/") or u.startswith("data:") for u in requested), requested
        assert any(u.endswith("/docs/assets/swagger-ui-bundle.js") for u in requested), requested
        refused = [c for c in page.console() if "Content Security Policy" in c or "Refused" in c]
        assert not refused, refused
        assert not page.failed_requests(), page.failed_requests()
        page.screenshot(tmp_path / "docs.png")
    assert browser.leftovers == [], f"chromium left processes behind: {browser.leftovers}"


def test_docs_assets_are_package_data() -> None:
    """A wheel install has the assets: pyproject.toml's package search finds samplecache_service.http.swagger_ui
    as a (data-only) package whose package data covers them."""
    from setuptools import find_namespace_packages

    root = ASSETS.parents[3]
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = tool["packages"]["find"]
    found = {p for where in find["where"]
             for p in find_namespace_packages(str(root / where), include=find["include"], exclude=find["exclude"])}
    assert "samplecache_service.http.swagger_ui" in found, sorted(found)
    assert not any("__pycache__" in p for p in found), sorted(found)
    patterns = tool["package-data"]["samplecache_service.http.swagger_ui"]
    needed = {"swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png", "LICENSE", "NOTICE"}
    covered = {n for n in needed for p in patterns if Path(n).match(p)}
    assert covered == needed, (patterns, needed - covered)
    assert json.loads((ASSETS / "package.json").read_text())["name"] == "swagger-ui-dist"
