"""/dashboard in headless Chromium, against a real push service process and real gateway
processes with a real WebSocket client: the login, the fleet, counters that move when
pushes go out, a drain refused by the last-of-its-group guard and one that takes a
gateway out of the fleet, and a wrong key refused. With IMROUTE_SCREENSHOT=1 it keeps
its screenshot in docs/assets/dashboard.png."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.browser.admin_stack import ADMIN_KEY, stack
from tests.conftest import API_KEY
from tests.integration.procs import ws_url_of
from tests.integration.stack import AUTH, ready, recv_json, token

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

DOCS = Path(__file__).resolve().parents[2] / "docs"


async def _tile(page: Any, name: str) -> float:
    text = await page.inner_text(f"#rate-{name} .v")
    return 0.0 if text == "\u2013" else float(text)  # an en dash: no figure yet


async def test_the_dashboard_logs_in_shows_the_fleet_and_drains(
    browser: Any, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    specs = [("gw1", "g1"), ("gw2", "g1"), ("gw3", "g2")]
    with stack(redis_url, prefix, tmp_path, "0.5", *specs) as (port, procs):
        urls = {gid: await ws_url_of(proc) for gid, proc in procs.items()}
        base = f"http://127.0.0.1:{port}"
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(str(e)))
        dialogs: list[str] = []

        async def accept(dialog: Any) -> None:
            dialogs.append(dialog.message)
            await dialog.accept()

        page.on("dialog", accept)

        # A wrong key: refused, and nothing of the fleet is shown.
        await page.goto(f"{base}/dashboard/")
        assert await page.is_hidden("#board")
        await page.fill("input[type=password][name=key]", "not-the-key-0123456789")
        await page.press("input[name=key]", "Enter")
        await page.wait_for_selector("#login-error:has-text('Key refused')")
        assert await page.is_hidden("#board")
        assert await page.locator("tr[data-gateway]").count() == 0

        # The right one (the API key alone is not enough either).
        await page.fill("input[name=key]", API_KEY)
        await page.press("input[name=key]", "Enter")
        await page.wait_for_selector("#login-error:has-text('403')")
        await page.fill("input[name=key]", ADMIN_KEY)
        await page.press("input[name=key]", "Enter")
        for gid in ("gw1", "gw2", "gw3"):
            await page.wait_for_selector(f"tr[data-gateway={gid}]", timeout=10_000)
        assert await page.is_hidden("#login-view")
        assert await page.locator("div[data-group]").count() == 2

        # Pushes go out to a real client: the counters move.
        assert await _tile(page, "p2p") == 0
        async with (
            connect(f"{urls['gw1']}?token={token('amy')}") as amy,
            httpx.AsyncClient(base_url=base) as http,
        ):
            await ready(amy)
            await asyncio.sleep(0.3)  # its route is written
            for n in range(20):
                resp = await http.post("/v1/push", json={"to": ["amy"], "content": n}, headers=AUTH)
                assert resp.status_code == 200, resp.text
                frame = await recv_json(amy)
                assert frame["content"] == n
                await amy.send(json.dumps({"type": "ack", "pos": frame["pos"]}))
            # A multicast: the latest jobs list it, with its progress.
            job = await http.post(
                "/v1/multicast", json={"to": ["amy", "bob"], "content": "m"}, headers=AUTH
            )
            assert job.status_code == 202, job.text
            assert (await recv_json(amy))["content"] == "m"
            row = f"tr[data-job='{job.json()['push_id']}']"
            await page.wait_for_selector(f"{row}:has-text('done')", timeout=10_000)
            await page.click(f"{row} a")
            assert job.json()["push_id"] in await page.inner_text("#job-detail")
            for name in ("p2p", "delivered"):  # each process writes its own counts
                await page.wait_for_function(
                    f"() => Number(document.querySelector('#rate-{name} .v').textContent) > 0",
                    timeout=10_000,
                )
            assert await _tile(page, "p50") > 0
            await page.wait_for_function(
                "() => Number(document.querySelector('#rate-acked .v').textContent) > 0",
                timeout=10_000,
            )
            assert "1 /" in await page.inner_text("tr[data-gateway=gw1] td:nth-child(6)")

        # The test client panel: the browser client, connected as bob, gets his push.
        await page.fill("#tc-token", token("bob"))
        await page.press("#tc-token", "Enter")
        await page.wait_for_selector("#tc-log li:has-text('recovered 0')", timeout=10_000)
        async with httpx.AsyncClient(base_url=base) as http:
            resp = await http.post("/v1/push", json={"to": ["bob"], "content": "hi"}, headers=AUTH)
            assert resp.json()["delivered"] == ["bob"], resp.text
        await page.wait_for_selector("#tc-log li:has-text('\"hi\"')", timeout=10_000)
        assert "connected to gw" in await page.inner_text("#tc-state")

        if os.environ.get("IMROUTE_SCREENSHOT") == "1":
            await page.screenshot(path=str(DOCS / "assets" / "dashboard.png"), full_page=True)
        else:
            await page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

        # gw3 is the last of g2: the guard's 409 is shown, and it stays.
        await page.click("tr[data-gateway=gw3] button")
        await page.wait_for_selector("#message.error:has-text('409')")
        assert "gw3" in dialogs[-1]
        # gw1 is not: it drains, exits, and leaves the table.
        await page.click("tr[data-gateway=gw1] button")
        await page.wait_for_selector("#message:has-text('draining gw1')")
        await page.wait_for_selector("tr[data-gateway=gw1]", state="detached", timeout=20_000)
        assert await page.locator("tr[data-gateway=gw3]").count() == 1
        assert problems == [], problems


async def test_a_garbled_overview_is_said_and_a_logout_mid_poll_stays_out(
    browser: Any, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """An overview the board cannot read used to end the polling for good (a stale
    board); a logout while a poll was in flight showed the board again when it landed."""
    with stack(redis_url, prefix, tmp_path, "0.5") as (port, _):
        page = await browser.new_page()
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(str(e)))
        garbled = [1]
        hold: list[asyncio.Event] = []
        held = asyncio.Event()

        async def overview(route: Any) -> None:
            if garbled[0]:
                garbled[0] -= 1
                await route.fulfill(status=200, content_type="application/json", body="{cut")
                return
            if hold:
                held.set()
                await hold[0].wait()
            await route.continue_()

        await page.route("**/v1/admin/overview", overview)
        await page.goto(f"http://127.0.0.1:{port}/dashboard/")
        await page.fill("input[name=key]", ADMIN_KEY)
        await page.press("input[name=key]", "Enter")
        await page.wait_for_selector("#status:has-text('could not be shown')")
        await page.wait_for_selector("#status:has-text('updated')", timeout=10_000)
        assert await page.is_visible("#board")

        hold.append(asyncio.Event())  # the next poll is held in flight ...
        await asyncio.wait_for(held.wait(), 10.0)
        await page.click("#logout")  # ... while the operator logs out
        async with page.expect_response("**/v1/admin/overview"):
            hold[0].set()
        await asyncio.sleep(0.3)  # it landed (the next poll would be 1.5 s away)
        assert await page.is_hidden("#board") and await page.is_visible("#login-view")
        await asyncio.sleep(2.0)  # and no poll runs after a logout
        assert await page.is_hidden("#board") and await page.is_visible("#login-view")
        assert problems == [], problems
