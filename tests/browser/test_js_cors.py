"""clients/js/imroute.js in headless Chromium, from a page on the app's own origin (not
the push service's), as apps serve their pages: with that origin in
IMROUTE_CORS_ORIGINS it imports the client from the push service, dispatches and gets a
push; a page on an origin not listed can do neither, and the client says so through
onState instead of retrying in silence."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.admin_stack import stack
from tests.integration.procs import read_until
from tests.integration.stack import AUTH, token

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

# The app's page: it imports the client from the push service (`api`), as
# docs/clients/browser.md shows, and connects.
CONNECT = """async ([api, token]) => {
  const { ImrouteClient } = await import(`${api}/client/imroute.js`);
  window.got = [];
  window.client = new ImrouteClient({
    apiUrl: api, token, onMessage: (f) => { window.got.push(f.content); },
  });
  await window.client.connect();
  return window.client.gateway.gateway_id;
}"""

# The client's source, given to the page as a module of its own origin (a blob:), so
# that only its dispatch calls cross to the push service.
DISPATCH_ONLY = """async ([api, token, source]) => {
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  const { ImrouteClient } = await import(url);
  window.states = [];
  window.client = new ImrouteClient({
    apiUrl: api, token, backoffMinMs: 50, backoffMaxMs: 200,
    onState: (s, d) => { window.states.push([s, String(d && d.error)]); },
  });
  window.client.connect().catch(() => {});
}"""


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><title>the app</title><p>the app's own page</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def _site() -> Iterator[str]:
    """An app's web server on a port of its own: its origin."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_a_page_on_a_listed_origin_uses_the_client_and_one_not_listed_is_told(
    browser: Any, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    with (
        _site() as app_origin,
        _site() as other_origin,
        stack(
            redis_url, prefix, tmp_path, "0.2", ("gw1", "g1"), IMROUTE_CORS_ORIGINS=app_origin
        ) as (port, procs),
    ):
        await asyncio.to_thread(read_until, procs["gw1"], "ready")
        api = f"http://127.0.0.1:{port}"
        problems: list[str] = []

        page = await browser.new_page()
        page.on("pageerror", lambda e: problems.append(str(e)))
        await page.goto(f"{app_origin}/")
        assert await page.evaluate(CONNECT, [api, token("amy")]) == "gw1"
        async with httpx.AsyncClient(base_url=api) as http:
            pushed = await http.post("/v1/push", json={"to": ["amy"], "content": 7}, headers=AUTH)
            assert pushed.status_code == 200 and pushed.json()["delivered"] == ["amy"]
            source = (await http.get("/client/imroute.js")).text
        await page.wait_for_function("() => window.got.length >= 1", timeout=10_000)
        assert await page.evaluate("() => window.got") == [7]
        await page.evaluate("() => window.client.close()")

        # Another origin: the browser refuses the import from the push service...
        other = await browser.new_page()
        other.on("pageerror", lambda e: problems.append(str(e)))
        await other.goto(f"{other_origin}/")
        with pytest.raises(Exception, match="Failed to fetch dynamically imported module"):
            await other.evaluate(CONNECT, [api, token("amy")])
        # ... and, with the client's code of its own, every dispatch: each one told.
        await other.evaluate(DISPATCH_ONLY, [api, token("amy"), source])
        await other.wait_for_function("() => window.client.stats.dispatchErrors >= 2")
        states = await other.evaluate("() => window.states")
        assert states[0] == ["reconnecting", "TypeError: Failed to fetch"], states
        assert await other.evaluate("() => window.client.stats.connects") == 0
        await other.evaluate("() => window.client.close()")
        assert problems == [], problems
