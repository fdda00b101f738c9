"""Acks on the wire: a scripted gateway (a real `websockets` server on loopback) sends
pushes and records the frames the client sends back; dispatch is httpx's mock transport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from imroute_client import ImrouteClient, MemoryPosStore, Message
from websockets.asyncio.server import ServerConnection, serve


def push(n: int, **extra: Any) -> str:
    return json.dumps({"type": "push", "msg_id": f"m{n}", "push_id": f"p{n}", "msg_type": 0,
                       "from": "admin", "content": n, "ts": 1, "pos": f"pos-{n}",
                       **extra})  # fmt: skip


@dataclass
class Gateway:
    """What each connection (0, 1, ...) received: (loop time, frame)."""

    frames: list[list[tuple[float, Any]]] = field(default_factory=list)
    closed: list[asyncio.Event] = field(default_factory=list)

    def acks(self, conn: int) -> list[str]:
        return [f["pos"] for _, f in self.frames[conn] if f.get("type") == "ack"]

    async def ack_for(self, conn: int, pos: str) -> float:
        """When connection `conn` acked `pos` (loop time); fails after 5 s."""
        async with asyncio.timeout(5.0):
            while True:
                for t, f in self.frames[conn] if conn < len(self.frames) else ():
                    if f == {"type": "ack", "pos": pos}:
                        return t
                await asyncio.sleep(0.01)


Script = Callable[[int, ServerConnection, Gateway], Awaitable[None]]


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    gw = Gateway()

    async def handler(ws: ServerConnection) -> None:
        conn = len(gw.frames)
        gw.frames.append([])
        gw.closed.append(asyncio.Event())

        async def read() -> None:
            async for data in ws:
                gw.frames[conn].append((asyncio.get_running_loop().time(), json.loads(data)))
            gw.closed[conn].set()

        reader = asyncio.create_task(read())
        await script(conn, ws, gw)
        await reader

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        target = {"ws_url": f"ws://127.0.0.1:{port}/ws", "gateway_id": "gw1", "group_id": "g1"}
        mock = httpx.MockTransport(lambda _: httpx.Response(200, json=target))
        async with httpx.AsyncClient(transport=mock) as http:
            yield gw, http


async def test_a_burst_is_acked_with_few_frames_the_last_one_while_the_app_idles() -> None:
    async def script(conn: int, ws: ServerConnection, gw: Gateway) -> None:
        for n in range(1, 201):
            await ws.send(push(n))

    async with (
        scripted(script) as (gw, http),
        ImrouteClient("http://api", "tok", http=http) as client,
        asyncio.TaskGroup() as tg,
    ):
        for n in range(1, 201):
            assert (await anext(client)).msg_id == f"m{n}"
            await asyncio.sleep(0.002)  # the app's handler awaits something
        idle = tg.create_task(anext(client))  # done with m200: the app waits, idle
        start = gw.frames[0][0][0]
        last = await gw.ack_for(0, "pos-200")
        assert client.stats.acked == 200
        acks = gw.acks(0)
        assert client.stats.acks_sent == len(acks)
        assert len(acks) <= (last - start) / 0.1 + 2  # at most one per 100 ms
        assert acks[0] == "pos-1"  # the first goes at once
        idle.cancel()
    assert gw.acks(0)[-1] == "pos-200" and client.stats.unacked_at_close == 0


async def test_the_pending_ack_leaves_after_the_interval_without_another_push() -> None:
    async def script(conn: int, ws: ServerConnection, gw: Gateway) -> None:
        await ws.send(push(1))
        await ws.send(push(2))
        await gw.closed[conn].wait()

    async with (
        scripted(script) as (gw, http),
        ImrouteClient("http://api", "tok", http=http, ack_interval_s=0.3) as client,
        asyncio.TaskGroup() as tg,
    ):
        got = [await anext(client), await anext(client)]
        idle = tg.create_task(anext(client))  # done with m2: waiting for a third
        first = await gw.ack_for(0, "pos-1")
        second = await gw.ack_for(0, "pos-2")
        assert second - first >= 0.25  # paced, not at once
        assert [m.msg_id for m in got] == ["m1", "m2"] and not idle.done()
        idle.cancel()


async def test_without_auto_ack_nothing_is_acked_until_the_app_acks() -> None:
    async def script(conn: int, ws: ServerConnection, gw: Gateway) -> None:
        for n in range(1, 4):
            await ws.send(push(n))
        await gw.closed[conn].wait()

    store = MemoryPosStore()
    async with (
        scripted(script) as (gw, http),
        ImrouteClient("http://api", "tok", http=http, auto_ack=False, pos_store=store) as client,
        asyncio.TaskGroup() as tg,
    ):
        got = [await anext(client) for _ in range(3)]
        idle = tg.create_task(anext(client))
        await asyncio.sleep(0.3)  # three pacing intervals: nothing may leave by itself
        assert gw.acks(0) == [] and client.stats.acks_sent == 0
        # The position follows the app's acks: a resume's `since` would ack m1-m3.
        assert store.pos is None
        await client.ack(got[1])  # m1 and m2
        assert store.pos == "pos-2"
        await gw.ack_for(0, "pos-2")
        await client.ack(got[0])  # covered already: no frame
        await client.ack(got[2])
        await gw.ack_for(0, "pos-3")
        assert gw.acks(0) == ["pos-2", "pos-3"]
        assert (client.stats.acks_sent, client.stats.acked) == (2, 3)
        idle.cancel()


async def test_a_pending_ack_dies_with_its_connection_and_the_resent_push_is_dropped() -> None:
    async def script(conn: int, ws: ServerConnection, gw: Gateway) -> None:
        if conn == 0:
            await ws.send(push(1))
            await gw.ack_for(0, "pos-1")
            await ws.send(push(2))
            await asyncio.sleep(0.3)  # the client is done with m2; its ack is paced
            await ws.close(4503, "draining")
        else:
            # Sent again, as an inbox would: m2 was never acked. Twice, to be sure.
            await ws.send(push(2, recovered=True))
            await ws.send(push(2, recovered=True))
            await ws.send('{"type":"recovered","count":2,"complete":true}')
            await ws.send(push(3))
            await gw.closed[conn].wait()

    got: list[Message] = []
    async with (
        scripted(script) as (gw, http),
        ImrouteClient("http://api", "tok", http=http, ack_interval_s=60.0) as client,
    ):
        async for msg in client:
            got.append(msg)
            if msg.msg_id == "m2":
                # Acking m2 on the new connection would name a position of the old one.
                await asyncio.sleep(0.5)
                assert client.stats.connects == 1
            if msg.msg_id == "m3":
                break
        assert [m.msg_id for m in got] == ["m1", "m2", "m3"]
        assert client.stats.duplicates == 2
        assert client.stats.unacked_at_close == 1  # m2's pending ack, dropped
        assert gw.acks(0) == ["pos-1"]
        # The duplicates are done with as they arrive: acked at once (the first ack).
        await gw.ack_for(1, "pos-2")
        await client.ack(got[1])  # from the old connection: nothing is sent
    # Leaving the loop normally: m3 is done, its ack (paced for 60 s) goes before the close.
    await gw.ack_for(1, "pos-3")
    assert gw.acks(1) == ["pos-2", "pos-3"]
    assert client.stats.acked == 4 and client.stats.unacked_at_close == 1


async def test_without_auto_ack_a_push_sent_again_waits_for_the_app_s_ack_of_it() -> None:
    queries: list[str] = []

    async def script(conn: int, ws: ServerConnection, gw: Gateway) -> None:
        assert ws.request is not None
        queries.append(ws.request.path)
        if conn == 0:
            await ws.send(push(1))
            await ws.send(push(2))
            await asyncio.sleep(0.3)  # the app holds both, unacked
            await ws.close(4503, "draining")
        else:
            await ws.send(push(1))  # sent again, as an inbox does: nothing acked them
            await ws.send(push(2))
            await ws.send(push(3))
            await gw.closed[conn].wait()

    async with (
        scripted(script) as (gw, http),
        ImrouteClient("http://api", "tok", http=http, auto_ack=False) as client,
        asyncio.TaskGroup() as tg,
    ):
        old = [await anext(client), await anext(client)]
        m3 = await asyncio.wait_for(anext(client), 10)
        assert m3.msg_id == "m3" and client.stats.duplicates == 2
        idle = tg.create_task(anext(client))
        await asyncio.sleep(0.3)
        assert gw.acks(1) == []  # the copies of what the app holds are not acked for it
        assert "since" not in queries[1]  # nothing was acked: no position either
        await client.ack(old[1])  # as the app got it, on the ended connection
        await gw.ack_for(1, "pos-2")  # its copy, on the live one (m1's too)
        assert client.pos == "pos-2"
        await client.ack(m3)
        await gw.ack_for(1, "pos-3")
        assert gw.acks(1) == ["pos-2", "pos-3"] and client.stats.acked == 3
        idle.cancel()
