"""The dashboard and /docs in headless Chromium under their CSP, against a real push
service process: each works with no violation of its policy and no request to another
origin, and neither can be framed. (Their headers: tests/integration/test_pages.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ADMIN_KEY
from tests.integration.http_raw import push_service

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

# Every violation of the page's CSP, as the page itself sees them.
WATCH_CSP = """
window.violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.violations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


async def _page(browser: Any, base: str) -> tuple[Any, list[str]]:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await page.add_init_script(WATCH_CSP)
    elsewhere: list[str] = []
    page.on(
        "request",
        lambda r: None if r.url.startswith((base, "data:")) else elsewhere.append(r.url),
    )
    return page, elsewhere


async def test_the_dashboard_and_docs_work_under_their_csp_and_cannot_be_framed(
    browser: Any, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    env = {"IMROUTE_ADMIN_API_KEY": ADMIN_KEY}
    with push_service(redis_url, prefix, tmp_path, **env) as (_, port):
        base = f"http://127.0.0.1:{port}"

        # The dashboard, logged in: its tiles drawn (no gateway: an empty fleet).
        page, elsewhere = await _page(browser, base)
        await page.goto(f"{base}/dashboard/")
        await page.fill("input[name=key]", ADMIN_KEY)
        await page.press("input[name=key]", "Enter")
        await page.wait_for_selector("#tiles .tile", timeout=10_000)
        assert await page.evaluate("window.violations") == []
        assert elsewhere == []

        # /docs: Swagger UI from the push service itself, reading /openapi.json, with an
        # operation opened and tried ("Try it out": a 401 without a key).
        page, elsewhere = await _page(browser, base)
        await page.goto(f"{base}/docs")
        await page.wait_for_selector("#operations-default-push_v1_push_post", timeout=15_000)
        await page.click("#operations-default-push_v1_push_post .opblock-summary")
        await page.click("button.try-out__btn")
        await page.click("button.execute")
        await page.wait_for_selector(".live-responses-table", timeout=10_000)
        assert "401" in await page.inner_text(".live-responses-table")
        assert await page.evaluate("window.violations") == []
        assert elsewhere == []

        # Framed by another page: the browser refuses to show either.
        for path in ("/dashboard/", "/docs"):
            page = await browser.new_page()
            await page.set_content(f'<iframe src="{base}{path}"></iframe>')
            await page.wait_for_timeout(1500)
            [frame] = page.main_frame.child_frames
            assert not frame.url.startswith(base), frame.url
            assert await frame.query_selector("#login-view, #swagger-ui") is None
