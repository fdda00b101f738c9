"""Receipts of a multicast: paging a 5,000-recipient multicast's recipients by state,
and the counts-only answer past the bound. A real gateway, the API, real Redis and raw
WebSocket clients."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.integration.recovery_helpers import ack, acked, multicast_acked, open_ws, pushes, replay
from tests.integration.stack import AUTH, api, fanout, gateway, one_group, push_status

pytestmark = pytest.mark.integration


async def listing(http: httpx.AsyncClient, push_id: str, state: str, limit: int) -> list[str]:
    """Every uid in `state`, page by page; checks each page's order and size."""
    uids: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"state": state, "limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        resp = await http.get(f"/v1/pushes/{push_id}/recipients", params=params, headers=AUTH)
        assert resp.status_code == 200, resp.text
        page = resp.json()
        assert len(page["uids"]) <= limit and page["uids"] == sorted(page["uids"])
        uids += page["uids"]
        cursor = page["cursor"]
        if cursor is None:
            return uids


async def test_paging_a_5000_recipient_multicast_by_state(redis_url: str, prefix: str) -> None:
    everyone = [f"u{n:04d}" for n in range(5000)]
    online = everyone[::250]  # 20 connected, of whom 10 ack
    acking = online[::2]
    async with one_group(redis_url, prefix) as (gw, http):
        sockets = {u: await open_ws(gw, u) for u in online}
        for ws in sockets.values():
            await replay(ws)
        push_id = await fanout(http, "/v1/multicast", {"to": everyone, "content": "news"})
        frames = {u: (await pushes(ws, 1))[0] for u, ws in sockets.items()}
        for u in acking:
            await ack(sockets[u], frames[u])
        await acked(gw, len(acking))
        for _ in range(100):  # the gateway's delivery reports land with its acks
            s = await push_status(http, push_id)
            if s["delivered"] == len(online):
                break
            await asyncio.sleep(0.05)
        assert (s["mode"], s["status"], s["listable"]) == ("multicast", "done", True)
        assert (s["recipients"], s["online"], s["offline"]) == (5000, 20, 4980)
        assert (s["delivered"], s["acked"], s["queued"]) == (20, 10, 4980)
        assert await listing(http, push_id, "acked", 3) == sorted(acking)
        unacked = await listing(http, push_id, "unacked", 1000)
        assert unacked == sorted(set(everyone) - set(acking)) and len(unacked) == 4990
        queued = await listing(http, push_id, "queued", 700)
        assert queued == sorted(set(everyone) - set(online))
        # Bad input: a clear 422; an unknown push: 404.
        bad = await http.get(
            f"/v1/pushes/{push_id}/recipients", params={"state": "lost"}, headers=AUTH
        )
        assert bad.status_code == 422 and "state" in bad.text
        missing = await http.get("/v1/pushes/nope/recipients?state=acked", headers=AUTH)
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        for ws in sockets.values():
            await ws.close()


async def test_past_the_bound_a_receipt_keeps_counts_only(redis_url: str, prefix: str) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1") as gw,
        api(redis_url, prefix, receipts_max_recipients=10) as http,
    ):
        to = [f"big{n}" for n in range(50)]
        push_id, ws = await multicast_acked(gw, http, to, "all")
        for _ in range(100):
            s = await push_status(http, push_id)
            if s["acked"] == 1:
                break
            await asyncio.sleep(0.05)
        assert (s["recipients"], s["online"], s["delivered"], s["acked"]) == (50, 1, 1, 1)
        assert s["listable"] is False and s["queued"] == 49
        resp = await http.get(f"/v1/pushes/{push_id}/recipients?state=acked", headers=AUTH)
        assert resp.status_code == 409, resp.text
        assert "IMROUTE_RECEIPTS_MAX_RECIPIENTS" in resp.json()["detail"]
        await ws.close()


async def test_a_broadcast_counts_its_deliveries_and_acks(redis_url: str, prefix: str) -> None:
    """Counts only: to everyone online (no recipients counted up front: 0, as its job has
    always said; `online` is those it reached), and to the directory (its recipients are
    the directory's users)."""
    async with one_group(redis_url, prefix) as (gw, http):
        users = {"users": [{"uid": u} for u in ("bc1", "bc2", "bc3")]}
        assert (await http.put("/v1/users", json=users, headers=AUTH)).status_code == 200
        sockets = {u: await open_ws(gw, u) for u in ("bc1", "bc2")}
        for ws in sockets.values():
            await replay(ws)
        acks = 0
        for body, recipients in (
            ({"content": "online", "audience": {"online": True}}, 0),
            ({"content": "directory"}, 3),
        ):
            push_id = await fanout(http, "/v1/broadcast", body)
            for ws in sockets.values():
                (frame,) = await pushes(ws, 1)
                await ack(ws, frame)
            acks += 2
            await acked(gw, acks)
            for _ in range(100):
                s = await push_status(http, push_id)
                if s["acked"] == 2:
                    break
                await asyncio.sleep(0.05)
            assert (s["mode"], s["listable"]) == ("broadcast", False)
            assert (s["recipients"], s["delivered"], s["acked"]) == (recipients, 2, 2), s
            assert recipients or s["online"] == 2, s
        for ws in sockets.values():
            await ws.close()
