"""Recovery end to end: real gateways, the real push API, real Redis, real WebSocket
clients, on both bus transports."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.positions import decode_pos
from socket_gateway.metrics import render
from tests.integration.recovery_helpers import ack, acked, gone, open_ws, pushes, reconnect, replay
from tests.integration.stack import AUTH, api, contents, fanout, gateway, nothing_more, p2p

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis-streams", "pubsub"])
def bus(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Settings for each bus transport (the Pub/Sub one skips without the emulator)."""
    if request.param == "pubsub":
        return {"bus_url": f"pubsub://{request.getfixturevalue('pubsub_project')}"}
    return {}


async def test_a_client_that_missed_20_gets_exactly_those_in_order(
    redis_url: str, prefix: str, bus: dict[str, Any]
) -> None:
    """10 read, 20 missed (P2P, multicast, directory and online broadcast mixed), then a
    resume with `since`: those 20, in order, then complete."""
    async with (
        gateway(redis_url, prefix, "gw1", "g1", **bus) as gw,
        api(redis_url, prefix, **bus) as http,
    ):
        users = [{"uid": "amy", "tags": ["t"]}, {"uid": "zed", "tags": ["t"]}]
        assert (await http.put("/v1/users", json={"users": users}, headers=AUTH)).status_code == 200
        ws = await open_ws(gw, "amy")
        assert (await replay(ws)) == ([], {"type": "recovered", "count": 0, "complete": True})
        for n in range(10):
            await p2p(http, ["amy"], n)
        seen = await pushes(ws, 10)
        assert contents(seen) == list(range(10))
        assert all(not f.get("recovered") for f in seen)
        since = seen[-1]["pos"]
        await ws.close()
        await gone(gw, "amy")

        for n in range(10, 30):
            kind = n % 4
            if kind == 0:
                body = await p2p(http, ["amy"], n)
                assert body["offline"] == ["amy"] and body["queued"] == ["amy"]
            elif kind == 1:
                await fanout(http, "/v1/multicast", {"to": ["amy", "zed"], "content": n})
            elif kind == 2:
                await fanout(http, "/v1/broadcast", {"content": n, "audience": {"tags_any": ["t"]}})
            else:
                await fanout(http, "/v1/broadcast", {"content": n, "audience": {"online": True}})

        ws = await open_ws(gw, "amy", since)
        got, end = await replay(ws)
        assert contents(got) == list(range(10, 30))
        assert all(f["recovered"] is True for f in got)
        assert end == {"type": "recovered", "count": 20, "complete": True}
        # Each replayed frame is the original: its ids, its time, a position of its own.
        assert len({f["msg_id"] for f in got}) == 20
        assert all(decode_pos(f["pos"]) is not None for f in got)
        body = await p2p(http, ["amy"], "live")
        assert body["delivered"] == ["amy"] and body["queued"] == []
        (live,) = await pushes(ws, 1)
        assert live["content"] == "live" and "recovered" not in live
        last = live["pos"]
        await ws.close()
        await gone(gw, "amy")

        # Resuming from the last position gives nothing more, completely; the position
        # acks the inbox entries it covers (this client never sent an ack frame).
        ws = await open_ws(gw, "amy", last)
        assert (await replay(ws)) == ([], {"type": "recovered", "count": 0, "complete": True})
        # So a new connection (no position) gets nothing from the inbox either.
        assert await reconnect(gw, ws, "amy") == []


async def test_live_pushes_during_a_1000_message_replay_are_neither_lost_nor_doubled(
    redis_url: str, prefix: str
) -> None:
    """The seam: pushes that arrive while 1000 are replayed come after them."""
    async with (
        gateway(redis_url, prefix, "gw1", "g1", recovery_user_max=5000) as gw,
        api(redis_url, prefix, recovery_user_max=5000) as http,
    ):
        ws = await open_ws(gw, "sam")
        await replay(ws)
        await p2p(http, ["sam"], -1)
        (first,) = await pushes(ws, 1)
        await ws.close()
        await gone(gw, "sam")
        for n in range(1000):
            await p2p(http, ["sam"], n, store=True)

        async def live() -> None:
            for n in range(1000, 1100):
                await p2p(http, ["sam"], n)
                if n % 10 == 0:
                    await asyncio.sleep(0.005)

        ws = await open_ws(gw, "sam", first["pos"])
        task = asyncio.create_task(live())
        got, end = await replay(ws)
        await task
        rest = await pushes(ws, 1100 - len(got))
        assert contents(got + rest) == list(range(1100))
        assert end["count"] == len(got) >= 1000 and end["complete"] is True
        assert all(f["recovered"] for f in got) and not any("recovered" in f for f in rest)
        await asyncio.sleep(0.3)
        assert await nothing_more(ws)
        await ws.close()


async def test_out_of_the_window_and_junk_positions_are_incomplete(
    redis_url: str, prefix: str
) -> None:
    """A `since` older than the window, or junk, gives complete:false (never a
    close); another user's position gives nothing of theirs."""
    async with (
        gateway(redis_url, prefix, "gw1", "g1", recovery_window_s=1) as gw,
        api(redis_url, prefix, recovery_window_s=1) as http,
    ):
        ws = await open_ws(gw, "ann")
        await replay(ws)
        await p2p(http, ["ann"], "a1")
        (a1,) = await pushes(ws, 1)
        await ws.close()
        await gone(gw, "ann")
        await p2p(http, ["ann"], "a2", store=True)
        await asyncio.sleep(1.3)  # a2 is out of the window now (but still in the inbox)
        ws = await open_ws(gw, "ann", a1["pos"])
        got, end = await replay(ws)
        assert end["complete"] is False
        assert contents(got) == ["a2"]  # it reached no connection: the inbox keeps it
        await ws.close()

        junks = ["%25%25%25", "x" * 300, "1~2~3", "1~01~0~0~g1~0", "%F0%9F%98%80"]
        for junk in junks:
            ws = await open_ws(gw, "bob", junk)
            got, end = await replay(ws)
            assert (got, end) == ([], {"type": "recovered", "count": 0, "complete": False}), junk
            await p2p(http, ["bob"], "still served")
            (served,) = await pushes(ws, 1)
            assert served["content"] == "still served"
            # Acked, so the next connection (a junk position is none) does not get it.
            await ack(ws, served)
            await acked(gw, 1 + junks.index(junk))
            await ws.close()
            await gone(gw, "bob")

        scrape = render(gw.metrics).decode()
        assert "imroute_gateway_resumes_incomplete_total 6.0" in scrape, scrape

        # Ann's position, sent by Bob: Bob's own log is read, never Ann's.
        ws = await open_ws(gw, "bob", a1["pos"])
        got, _ = await replay(ws)
        assert "a1" not in contents(got) and "a2" not in contents(got)
        await ws.close()
