"""The API docs at ``/docs``, offline: Swagger UI served by the daemon itself.

FastAPI's default ``/docs`` loads Swagger UI from a CDN, so on a training host without internet it is a blank
page. Here the page and its assets come from the daemon: ``swagger_ui/`` beside this module is the
``swagger-ui-dist`` npm package's bundle, stylesheet and icon, vendored with its LICENSE and NOTICE (its
README.md says which version and how to update it). The page asks nothing of any other origin: the online
validator badge is off, and a Content-Security-Policy allows only the daemon (the page's one inline script by
its hash). ``/redoc`` is not served (404): one docs UI is enough.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, swagger_ui_default_parameters
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(__file__).with_name("swagger_ui")
ASSETS_URL = "/docs/assets"
PARAMETERS = {**swagger_ui_default_parameters, "validatorUrl": None}  # no badge from validator.swagger.io
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def csp(html: str) -> str:
    """A policy that lets ``html`` run its inline scripts (by hash) and load only from the daemon. Swagger UI
    sets style attributes and uses data: images from its stylesheet, hence those two allowances."""
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
                      for s in _INLINE_SCRIPT.findall(html))
    return (f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def add_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and its assets on ``app`` (made with ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = str(request.scope.get("root_path", "")).rstrip("/")
        page = get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - API",
                                   swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{ASSETS_URL}/favicon-32x32.png",
                                   oauth2_redirect_url=None, swagger_ui_parameters=PARAMETERS)
        html = bytes(page.body).decode()
        return HTMLResponse(html, headers={"Content-Security-Policy": csp(html), "X-Content-Type-Options": "nosniff",
                                           "Referrer-Policy": "no-referrer"})
