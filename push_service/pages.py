"""The pages the push service serves to browsers, and the headers that keep them to
themselves: the dashboard (`/dashboard/`), the API docs (`/docs`) and the browser client
(`/client/imroute.js`, a script other pages import).

The admin key lives in the dashboard's sessionStorage, readable by any script that runs
on this origin; so no page here loads a script from anywhere else. The dashboard is our
own files; the docs are Swagger UI from the `swagger-ui-bundle-v2` package, served from
here (FastAPI's own /docs loads it from a CDN, without Subresource Integrity; its
/redoc too, and is off). Each page says so in its Content-Security-Policy, and may not
be framed (CSP frame-ancestors, and X-Frame-Options for older browsers). Every response
of the server says `X-Content-Type-Options: nosniff` (`http_server.RESPONSE_HEADERS`).
"""

from __future__ import annotations

from pathlib import Path

import swagger_ui_bundle
from fastapi import FastAPI
from fastapi.responses import FileResponse
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

__all__ = ["DASHBOARD_CSP", "DOCS_CSP", "add_pages", "dashboard_csp"]

HERE = Path(__file__).parent
DASHBOARD = HERE / "dashboard"
CLIENT = HERE / "client"  # imroute.js: a link to clients/js/imroute.js
DOCS_PAGE = HERE / "docs_ui" / "index.html"
SWAGGER_UI = Path(str(swagger_ui_bundle.swagger_ui_path))
# What /docs/ui/ serves: Swagger UI's script and styles, and our start-up script; the
# package's other files (its own index.html, for one, opens a sample API) are not.
DOCS_FILES = {
    "swagger-ui-bundle.js": SWAGGER_UI / "swagger-ui-bundle.js",
    "swagger-ui.css": SWAGGER_UI / "swagger-ui.css",
    "docs.js": HERE / "docs_ui" / "docs.js",
}

_LOCKED = (
    "default-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'; img-src 'self' data:"
)
# The dashboard: its own script, styles and data; WebSockets to the gateways, whose
# addresses dispatch names, for its test client (IMROUTE_DASHBOARD_CONNECT_SRC).
DASHBOARD_CSP = f"{_LOCKED}; style-src 'self'; connect-src 'self' ws: wss:"


def dashboard_csp(connect_src: str) -> str:
    """The dashboard's policy, its WebSockets allowed to `connect_src` (CSP sources)."""
    return f"{_LOCKED}; style-src 'self'; connect-src 'self' {connect_src}"


# Swagger UI: its script, styles and this API (its "Try it out"), nothing else.
DOCS_CSP = f"{_LOCKED}; style-src 'self'; connect-src 'self'"


def page_headers(csp: str) -> dict[str, str]:
    return {
        "Content-Security-Policy": csp,
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
    }


class _Page(StaticFiles):
    """Static files, each answered with a page's headers."""

    def __init__(self, *, directory: Path, csp: str) -> None:
        super().__init__(directory=directory, html=True)
        self._headers = page_headers(csp)

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(self._headers)
        return response


def add_pages(app: FastAPI, connect_src: str = "ws: wss:") -> None:
    """Serve the dashboard, the browser client and the docs on `app` (made with
    docs_url=None and redoc_url=None; /openapi.json stays FastAPI's); the dashboard's
    test client may connect to `connect_src` (IMROUTE_DASHBOARD_CONNECT_SRC)."""
    # Public, as they hold no data (the dashboard's data needs the admin key).
    app.mount(
        "/dashboard", _Page(directory=DASHBOARD, csp=dashboard_csp(connect_src)), name="dashboard"
    )
    # The browser client (clients/js/imroute.js), for pages to import.
    app.mount("/client", StaticFiles(directory=CLIENT, follow_symlink=True), name="client")
    docs_headers = page_headers(DOCS_CSP)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> FileResponse:
        return FileResponse(DOCS_PAGE, headers=docs_headers)

    @app.get("/docs/ui/{name}", include_in_schema=False)
    async def docs_file(name: str) -> FileResponse:
        path = DOCS_FILES.get(name)
        if path is None:
            raise HTTPException(404, f"no {name} here: /docs/ui/ serves {', '.join(DOCS_FILES)}")
        return FileResponse(path, headers=docs_headers)
