"""Receipts of a multicast: paging a 5,000-recipient multicast's recipients by state,
and the counts-only answer past the bound. A real gateway, the API, real Redis and raw
WebSocket clients."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from push_service.services.receipts import SETTLE_MS
from shared.keys import KeySchema
from tests.integration.recovery_helpers import (
    ack,
    acked,
    connected,
    gone,
    multicast_acked,
    open_ws,
    pushes,
    replay,
)
from tests.integration.stack import (
    AUTH,
    api,
    contents,
    fanout,
    gateway,
    one_group,
    p2p,
    push_status,
)

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
        # big7 had a connection (its client keeps its position) and is away for the push.
        away = await connected(gw, "big7")
        await p2p(http, ["big7"], "before")
        (before,) = await pushes(away, 1)
        await away.close()
        await gone(gw, "big7")
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
        # It resumes from its position and is written the push: one fewer queued.
        late = await open_ws(gw, "big7", since=before["pos"])
        got, _ = await replay(late)
        assert contents(got) == ["all"]
        for _ in range(100):  # the gateway's delivery report lands with its next flush
            s = await push_status(http, push_id)
            if s["delivered"] == 2:
                break
            await asyncio.sleep(0.05)
        assert (s["delivered"], s["acked"], s["queued"]) == (2, 1, 48), s
        await late.close()
        await ws.close()


async def test_a_broadcast_counts_its_deliveries_and_acks(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """Counts only: to everyone online (no recipients counted up front: 0, as its job has
    always said), and to the directory (its recipients are the directory's users). A
    broadcast looks no route up: its `online` is those it reached, the rest `offline`,
    and `queued` those not written anywhere yet; its receipt keeps its recipients once
    its job's record is gone."""
    async with one_group(redis_url, prefix) as (gw, http):
        users = {"users": [{"uid": u} for u in ("bc1", "bc2", "bc3")]}
        assert (await http.put("/v1/users", json=users, headers=AUTH)).status_code == 200
        sockets = {u: await open_ws(gw, u) for u in ("bc1", "bc2")}
        for ws in sockets.values():
            await replay(ws)
        acks = 0
        for body, recipients, unreached in (
            ({"content": "online", "audience": {"online": True}}, 0, 0),
            ({"content": "directory"}, 3, 1),  # bc3 is offline
        ):
            push_id = await fanout(http, "/v1/broadcast", body)
            for ws in sockets.values():
                (frame,) = await pushes(ws, 1)
                await ack(ws, frame)
            acks += 2
            await acked(gw, acks)
            for _ in range(100):
                s = await push_status(http, push_id)
                if s["acked"] == 2 and s["status"] == "done":
                    break
                await asyncio.sleep(0.05)
            assert (s["mode"], s["listable"]) == ("broadcast", False)
            assert (s["recipients"], s["delivered"], s["acked"]) == (recipients, 2, 2), s
            assert (s["online"], s["offline"], s["queued"]) == (2, unreached, unreached), s
        await redis.delete(KeySchema(prefix).job(push_id))  # its record lapsed
        after = await push_status(http, push_id)  # the receipt alone says the same
        same = ("mode", "status", "recipients", "online", "offline", "delivered", "queued")
        assert {k: after[k] for k in same} == {k: s[k] for k in same}, after
        for ws in sockets.values():
            await ws.close()


async def tagged_one_online(http: httpx.AsyncClient, gw: Any, online: str, offline: str) -> Any:
    """Two directory users tagged "t": `online` connected (its socket), `offline` not."""
    users = {"users": [{"uid": u, "tags": ["t"]} for u in (online, offline)]}
    assert (await http.put("/v1/users", json=users, headers=AUTH)).status_code == 200
    ws = await open_ws(gw, online)
    await replay(ws)
    return ws


async def sent_and_done(
    http: httpx.AsyncClient, ws: Any, path: str, body: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """A broadcast or multicast sent, its one online recipient (`ws`) written it, its job
    done: (its push id, its status)."""
    push_id = await fanout(http, path, body)
    (frame,) = await pushes(ws, 1)
    assert frame["content"] == body["content"]
    for _ in range(100):
        s = await push_status(http, push_id)
        if s["delivered"] == 1 and s["status"] == "done":
            break
        await asyncio.sleep(0.05)
    return push_id, s


async def ended_ago(redis: aioredis.Redis, prefix: str, push_id: str, ms: int) -> None:
    """The job of `push_id` recorded as having ended `ms` earlier than it did."""
    job = KeySchema(prefix).job(push_id)
    ended = int(await redis.hget(job, "finished_at"))
    await redis.hset(job, "finished_at", ended - ms)


async def test_a_push_not_kept_counts_whom_it_did_not_reach_expired_once_done(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """`store:false`, counts only (a broadcast, a multicast to a directory audience): a
    user offline is never written it, so SETTLE_MS after the job ended it is expired, not
    queued for ever; its receipt alone says the same once the job's record is gone."""
    async with one_group(redis_url, prefix) as (gw, http):
        ws = await tagged_one_online(http, gw, "nk1", "nk2")
        for path, body in (
            ("/v1/broadcast", {"content": "b", "store": False}),
            ("/v1/multicast", {"content": "m", "store": False, "audience": {"tags_any": ["t"]}}),
        ):
            push_id, s = await sent_and_done(http, ws, path, body)
            assert s["listable"] is False
            # Just ended: a gateway may still be writing it.
            assert (s["recipients"], s["delivered"], s["queued"], s["expired"]) == (2, 1, 1, 0), s
            await ended_ago(redis, prefix, push_id, SETTLE_MS)
            s = await push_status(http, push_id)
            assert (s["recipients"], s["delivered"], s["queued"], s["expired"]) == (2, 1, 0, 1), s
            await redis.delete(KeySchema(prefix).job(push_id))  # its record lapsed
            after = await push_status(http, push_id)
            assert (after["delivered"], after["queued"], after["expired"]) == (1, 0, 1), after
        await ws.close()


async def test_a_stored_fanout_s_offline_recipients_expire_with_the_recovery_window(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """Both trials: a broadcast's or multicast's offline recipient read `queued` for the
    receipt's life, though a fresh connection never gets it (a P2P push's inbox holds
    it; a fan-out's batches are read only by a resume within IMROUTE_RECOVERY_WINDOW_S).
    From the end of that window after the job ended, they count as expired."""
    window_ms = 300_000  # IMROUTE_RECOVERY_WINDOW_S's default
    async with one_group(redis_url, prefix) as (gw, http):
        ws = await tagged_one_online(http, gw, "fo1", "fo2")
        for path, body in (
            ("/v1/broadcast", {"content": "b"}),
            ("/v1/multicast", {"content": "m", "audience": {"tags_any": ["t"]}}),
            ("/v1/multicast", {"content": "l", "to": ["fo1", "fo2"]}),  # listable
        ):
            push_id, s = await sent_and_done(http, ws, path, body)
            # Within the window: fo2 may still resume from a position before it.
            assert (s["delivered"], s["queued"], s["expired"]) == (1, 1, 0), s
            await ended_ago(redis, prefix, push_id, SETTLE_MS + window_ms)
            s = await push_status(http, push_id)
            assert (s["delivered"], s["queued"], s["expired"]) == (1, 0, 1), (path, body, s)
            if s["listable"]:
                listed = await http.get(
                    f"/v1/pushes/{push_id}/recipients", params={"state": "queued"}, headers=AUTH
                )
                assert listed.json()["uids"] == [], listed.text
        await ws.close()


async def test_an_ack_outlasts_the_inbox_bound_passing_its_message(
    redis_url: str, prefix: str
) -> None:
    """Acked, then more than IMROUTE_INBOX_MAX messages came while the user was away (the
    inbox's floor passed the acked one): its receipt still says acked, and still does
    once the user is back and acks those; the one the bound pushed out unwritten reads
    expired."""
    async with (
        gateway(redis_url, prefix, "gw1", "g1", inbox_max=3) as gw,
        api(redis_url, prefix, inbox_max=3) as http,
    ):
        ws = await connected(gw, "ivy")
        first = await p2p(http, ["ivy"], "read")
        (frame,) = await pushes(ws, 1)
        await ack(ws, frame)
        await acked(gw, 1)
        await ws.close()
        await gone(gw, "ivy")
        away = [(await p2p(http, ["ivy"], n))["push_id"] for n in range(4)]
        assert (await push_status(http, first["push_id"]))["acked"] == 1
        ws = await open_ws(gw, "ivy")
        got, _ = await replay(ws)
        assert contents(got) == [1, 2, 3]  # 0 was pushed out by the bound
        await ack(ws, got[-1])
        await acked(gw, 4)
        assert (await push_status(http, first["push_id"]))["acked"] == 1
        for _ in range(100):  # the replay's delivery reports land with the acks
            states = [await push_status(http, p) for p in away]
            if all(s["acked"] for s in states[1:]):
                break
            await asyncio.sleep(0.05)
        assert [(s["acked"], s["expired"]) for s in states] == [(0, 1), (1, 0), (1, 0), (1, 0)]
        await ws.close()
