"""clients/js/imroute.js in headless Chromium, loaded from the push service
(/client/imroute.js) into a page, against a real push service process and two real
gateway processes: it receives pushes once each, follows a drain to the other gateway,
and resumes there without losing what was pushed meanwhile; a bad token stops it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.admin_stack import ADMIN_KEY, stack
from tests.integration.procs import read_until
from tests.integration.stack import AUTH, token

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

REPO = Path(__file__).resolve().parents[2]

START = """async ([token, ackIntervalMs]) => {
  const { ImrouteClient } = await import("/client/imroute.js");
  window.got = [];
  window.recovered = [];
  window.states = [];
  window.errors = [];
  window.client = new ImrouteClient({
    apiUrl: location.origin,
    token,
    onMessage: (f) => { window.got.push(f); },
    onRecovered: (f) => { window.recovered.push(f); },
    onError: (e) => { window.errors.push(String(e)); },
    onState: (s, d) => { window.states.push([s, d && d.gateway]); },
    ackIntervalMs,
  });
  await window.client.connect();
  return window.client.gateway.gateway_id;
}"""


async def _count(page: Any) -> int:
    n: int = await page.evaluate("() => window.got.length")
    return n


async def _wait_count(page: Any, n: int, timeout: float = 15.0) -> None:
    await page.wait_for_function(f"() => window.got.length >= {n}", timeout=timeout * 1000)


async def test_the_browser_client_receives_follows_a_drain_and_resumes_without_loss(
    browser: Any, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    with stack(redis_url, prefix, tmp_path, "0.2", ("gw1", "g1"), ("gw2", "g1")) as (port, procs):
        for proc in procs.values():
            await asyncio.to_thread(read_until, proc, "ready")
        base = f"http://127.0.0.1:{port}"
        # The module the push service serves is the one in clients/js.
        async with httpx.AsyncClient(base_url=base) as http:
            served = await http.get("/client/imroute.js")
            assert served.status_code == 200
            assert served.headers["content-type"].startswith(
                ("text/javascript", "application/javascript")
            )
            assert served.text == (REPO / "clients/js/imroute.js").read_text()

            page = await browser.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda e: problems.append(str(e)))
            await page.goto(f"{base}/dashboard/")
            # Acks held back (one a minute): the drain below finds every push unacked, so
            # only the resume's `since` keeps the new gateway from writing them again.
            first = await page.evaluate(START, [token("amy"), 60_000])
            assert first in ("gw1", "gw2")

            pushed: list[str] = []
            outcomes: list[Any] = []

            async def push(n: int) -> None:
                resp = await http.post("/v1/push", json={"to": ["amy"], "content": n}, headers=AUTH)
                assert resp.status_code == 200, resp.text
                pushed.append(resp.json()["push_id"])
                outcomes.append(
                    (resp.json()["delivered"], resp.json()["failed"], resp.json()["queued"])
                )

            for n in range(5):
                await push(n)
            await _wait_count(page, 5)

            # Its gateway drains: told to reconnect, it goes to the other one through
            # dispatch, resuming from its position. Pushes sent meanwhile (some written
            # to the draining gateway, some queued while it has no connection) arrive,
            # once each, in order.
            drain = await http.post(
                f"/v1/gateways/{first}/drain",
                headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            )
            assert drain.status_code == 202, drain.text
            for n in range(5, 25):
                await push(n)
                await asyncio.sleep(0.05)
            await _wait_count(page, 25, timeout=20)
            await asyncio.sleep(0.5)  # nothing more (no duplicate) comes after
            got = await page.evaluate("() => window.got.map((f) => f.content)")
            assert got == list(range(25)), got
            other = "gw2" if first == "gw1" else "gw1"
            assert await page.evaluate("() => window.client.gateway.gateway_id") == other
            stats = await page.evaluate("() => window.client.stats")
            assert stats["connects"] == 2 and stats["pushes"] == 25, stats
            assert stats["duplicates"] == 0, stats  # `since` resumed after the last one
            assert len(await page.evaluate("() => window.recovered")) == 2
            assert await page.evaluate("() => window.errors") == []
            # A reconnect that forgets its position (as after a reload without saving
            # `pos`) is written amy's inbox again: what the second gateway wrote is still
            # unacked there (the first's was acked by the resume's position). The dedupe
            # window drops every one.
            await page.evaluate(
                "() => { window.client.pos = null; window.client._ws.close(4000); }"
            )
            await page.wait_for_function("() => window.recovered.length >= 3", timeout=15_000)
            await asyncio.sleep(0.3)
            replayed = (await page.evaluate("() => window.recovered"))[2]["count"]
            stats = await page.evaluate("() => window.client.stats")
            assert replayed > 0 and stats["duplicates"] == replayed, (replayed, stats)
            assert await _count(page) == 25
            # close() sends the held ack: one cumulative ack covers all 25.
            await page.evaluate("() => window.client.close()")
            assert await page.evaluate("() => window.client.stats.acks") == 1
            # It reached the gateways: every push is acked, those before the drain by the
            # resume's position, the rest by the one ack close() sent.
            for _ in range(100):
                acked = [
                    (await http.get(f"/v1/pushes/{p}", headers=AUTH)).json()["acked"]
                    for p in pushed
                ]
                if all(acked):
                    break
                await asyncio.sleep(0.1)
            assert acked == [1] * 25, (acked, outcomes)

            # Its pure parts: the dedupe window and the backoff.
            parts = await page.evaluate(
                """async () => {
                  const { DedupeWindow, backoffMs } = await import("/client/imroute.js");
                  const d = new DedupeWindow(2);
                  return [["a", "a", "b", "c", "a"].map((id) => d.add(id)),
                          backoffMs(0, 100, 5000, () => 0.5), backoffMs(3, 100, 5000, () => 0),
                          backoffMs(20, 100, 5000, () => 0.99)];
                }"""
            )
            assert parts == [[True, False, True, True, True], 100, 400, 5000], parts

            # A token the gateways refuse: connect() rejects, and it stops.
            bad = await page.evaluate(
                """async () => {
                  const { ImrouteClient, UnauthorizedError } = await import("/client/imroute.js");
                  const c = new ImrouteClient({ apiUrl: location.origin, token: "not.a.jwt" });
                  try { await c.connect(); return "connected"; }
                  catch (e) { return `${e instanceof UnauthorizedError}:${e.message}`; }
                }"""
            )
            assert bad.startswith("true:") and "401" in bad, bad
            assert problems == [], problems
