"""The push service's response headers, over real HTTP to a real `python -m push_service`:
nosniff on every answer, a strict CSP and no framing for the dashboard and /docs, and
/docs served from the push service itself (no CDN script on the admin key's origin).
(In a browser: tests/browser/test_pages.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.integration.head_bombs import ask
from tests.integration.http_raw import push_service, request_head

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


def directives(csp: str) -> dict[str, str]:
    parts = (d.strip().split(None, 1) for d in csp.split(";") if d.strip())
    return {p[0]: p[1] if len(p) > 1 else "" for p in parts}


async def test_every_answer_says_nosniff_and_the_pages_their_csp(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    with push_service(redis_url, prefix, tmp_path) as (_, port):
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base) as http:
            answers = {
                "json": await http.get("/healthz"),
                "schema": await http.get("/openapi.json"),
                "refusal": await http.post("/v1/push", json={}),  # no key: 401
                "unknown": await http.get("/nowhere"),
                "dashboard": await http.get("/dashboard/"),
                "dashboard script": await http.get("/dashboard/dashboard.js"),
                "docs": await http.get("/docs"),
                "docs script": await http.get("/docs/ui/swagger-ui-bundle.js"),
                "client": await http.get("/client/imroute.js"),
                "metrics": await http.get("/metrics"),
            }
            assert answers["refusal"].status_code == 401
            assert answers["unknown"].status_code == 404
            assert answers["schema"].json()["paths"]["/v1/push"]
            for name, answer in answers.items():
                assert answer.headers["x-content-type-options"] == "nosniff", name
            # The push service's own answers before a request is whole say it too.
            raw = ask(port, request_head("GET", "/", **{f"X_{i}": "v" for i in range(120)}))
            assert raw.status == 431 and raw.headers["x-content-type-options"] == "nosniff"

            for page in ("dashboard", "docs"):
                answer = answers[page]
                assert answer.status_code == 200 and "text/html" in answer.headers["content-type"]
                assert answer.headers["x-frame-options"] == "DENY", page
                csp = directives(answer.headers["content-security-policy"])
                assert csp["frame-ancestors"] == "'none'", csp
                assert csp["default-src"] == "'self'" and csp["script-src"] == "'self'", csp
                assert csp["style-src"] == "'self'" and csp["object-src"] == "'none'", csp
                assert csp["base-uri"] == "'none'", csp
                # No script or style of its own inline, and nothing from elsewhere.
                html = answer.text
                assert not re.search(r"<script(?![^>]*\bsrc=)", html), page
                assert " style=" not in html and "<style" not in html, page
                assert not re.search(r"(src|href)=\"(https?:)?//", html), page
            # The dashboard's test client opens WebSockets to the gateways dispatch names.
            assert (
                directives(answers["dashboard"].headers["content-security-policy"])["connect-src"]
                == "'self' ws: wss:"
            )
            assert (
                directives(answers["docs"].headers["content-security-policy"])["connect-src"]
                == "'self'"
            )

            # Swagger UI comes from the package, its files one by one; FastAPI's /redoc
            # (a CDN's script) is gone, /openapi.json stays.
            assert "SwaggerUIBundle" in answers["docs script"].text
            assert "javascript" in answers["docs script"].headers["content-type"]
            assert (await http.get("/docs/ui/docs.js")).status_code == 200
            assert (await http.get("/docs/ui/swagger-ui.css")).status_code == 200
            for gone in ("/docs/ui/index.html", "/docs/ui/swagger-initializer.js", "/redoc"):
                answer = await http.get(gone)
                assert answer.status_code == 404 and answer.json()["error"] == "not_found"
            # The docs need no key, as before.
            assert (await http.get("/docs", headers={"Authorization": "Bearer x"})).is_success


async def test_the_dashboards_websockets_can_be_held_to_the_gateways_origins(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The finding: `connect-src 'self' ws: wss:` lets the dashboard open a WebSocket to
    any host. IMROUTE_DASHBOARD_CONNECT_SRC names the gateways' origins instead."""
    sources = "wss://gw1.example.com wss://*.gw.example.com:8443"
    env = {"IMROUTE_DASHBOARD_CONNECT_SRC": sources}
    with push_service(redis_url, prefix, tmp_path, **env) as (_, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            page = await http.get("/dashboard/")
        csp = directives(page.headers["content-security-policy"])
        assert csp["connect-src"] == f"'self' {sources}"
        assert csp["script-src"] == "'self'"
