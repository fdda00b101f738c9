"""Redis restarts empty under a running stack: a real redis-server SIGKILLed and started
again at the same address without persistence.

Before epochs, every multicast and broadcast after the restart was dropped as "late" by
the running gateway (the topic logs started again at 1, below what it had delivered),
P2P pushes answered `queued` stayed in the inbox of clients that never disconnected, and
some answered `delivered` were never written (their new, small seqs fell inside what the
connection's replay had covered). Here each client, connected throughout, gets every
push exactly once; a position from before the restart resumes `complete: false`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection

from shared.keys import KeySchema
from shared.positions import decode_pos, epoch_of
from tests.integration.recovery_helpers import open_ws, replay
from tests.integration.redis_process import redis_process
from tests.integration.stack import AUTH, api, fanout, gateway, recv_json
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

UIDS = ["amy", "bob", "cy"]


async def push(http: httpx.AsyncClient, uid: str, content: str) -> dict[str, Any]:
    """POST /v1/push, retried (same Idempotency-Key) while the push service answers 503
    for a Redis it is reconnecting to."""
    key = uuid.uuid4().hex
    for _ in range(100):
        resp = await http.post(
            "/v1/push",
            json={"to": [uid], "content": content},
            headers={**AUTH, "Idempotency-Key": key},
        )
        if resp.status_code != 503:
            assert resp.status_code == 200, resp.text
            body: dict[str, Any] = resp.json()
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"push to {uid} still answered 503")


async def collect(ws: ClientConnection, into: list[dict[str, Any]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            frame = await recv_json(ws, timeout=0.2)
        except TimeoutError:
            continue
        if frame["type"] == "push":
            into.append(frame)


async def test_a_redis_restarted_empty_loses_nothing_for_connected_clients(prefix: str) -> None:
    keys = KeySchema(prefix)
    with redis_process() as server:
        async with (
            gateway(server.url, prefix, "gw1", "g1", heartbeat_s=0.3, route_ttl_s=60) as gw,
            api(server.url, prefix) as http,
            AsyncExitStack() as stack,
        ):
            users = [{"uid": u, "tags": ["t"]} for u in UIDS]
            resp = await http.put("/v1/users", json={"users": users}, headers=AUTH)
            assert resp.status_code == 200
            sockets = {u: await open_ws(gw, u) for u in UIDS}
            for ws in sockets.values():
                stack.push_async_callback(ws.close)
                await replay(ws)
            frames: dict[str, list[dict[str, Any]]] = {u: [] for u in UIDS}
            stop = asyncio.Event()
            tasks = [asyncio.create_task(collect(sockets[u], frames[u], stop)) for u in UIDS]
            expected: dict[str, list[str]] = {u: [] for u in UIDS}

            async def everyone(kind: str, n: int) -> None:
                content = f"{kind}-{n}"
                if kind == "multicast":
                    await fanout(http, "/v1/multicast", {"to": UIDS, "content": content})
                elif kind == "broadcast":
                    body = {"content": content, "audience": {"tags_any": ["t"]}}
                    await fanout(http, "/v1/broadcast", body)
                else:
                    body = {"content": content, "audience": {"online": True}}
                    await fanout(http, "/v1/broadcast", body)
                for u in UIDS:
                    expected[u].append(content)

            async def each_kind(rounds: range) -> None:
                """A P2P push to each user, a multicast, a directory and an online
                broadcast, per round: all delivered at once."""
                for n in rounds:
                    for u in UIDS:
                        assert (await push(http, u, f"p2p-{n}"))["delivered"] == [u]
                        expected[u].append(f"p2p-{n}")
                    for kind in ("multicast", "broadcast", "online"):
                        await everyone(kind, n)

            # Before: every log has a history (P2P 1..3, every topic a few batches).
            await each_kind(range(3))
            await wait_for(
                lambda: all(len(frames[u]) == len(expected[u]) for u in UIDS),
                "the first pushes",
                10.0,
                every=0.02,
            )
            old_pos = frames["amy"][-1]["pos"]

            server.kill()
            server.start()  # the same address, nothing in it

            # At once: the routes are gone until the gateway's next heartbeat finds its
            # record missing, so these are answered offline and queued (or, once the
            # routes are back, delivered); either way each must reach its client, which
            # never disconnected, without a later push to carry it.
            answers = {u: await push(http, u, "during") for u in UIDS}
            for u, body in answers.items():
                assert body["delivered"] == [u] or body["queued"] == [u], body
                expected[u].append("during")
            await wait_for(
                lambda: all(f["content"] == "during" for f in (frames[u][-1] for u in UIDS)),
                "the pushes queued while the routes were gone",
                10.0,
                every=0.02,
            )
            fresh = aioredis.Redis.from_url(server.url)
            try:
                started = time.monotonic()
                while await fresh.exists(*(keys.route(u) for u in UIDS)) < len(UIDS):
                    assert time.monotonic() - started < 5, "routes did not come back"
                    await asyncio.sleep(0.05)
            finally:
                await fresh.aclose()

            # After: every log starts again under a new epoch, and all of it arrives.
            await each_kind(range(3, 6))
            await wait_for(
                lambda: all(len(frames[u]) >= len(expected[u]) for u in UIDS),
                "every push after the restart",
                10.0,
                every=0.02,
            )
            await asyncio.sleep(0.5)  # nothing more may come: no duplicate
            stop.set()
            await asyncio.gather(*tasks)
            for u in UIDS:
                got = [f["content"] for f in frames[u]]
                assert sorted(got) == sorted(expected[u]), (u, got, expected[u])
                assert len({f["msg_id"] for f in frames[u]}) == len(got)  # exactly once
            new_pos = decode_pos(frames["amy"][-1]["pos"])
            old = decode_pos(old_pos)
            assert new_pos is not None and old is not None
            assert epoch_of(new_pos.p) > epoch_of(old.p) and epoch_of(new_pos.b) > epoch_of(old.b)
            assert gw.follower is not None
            assert sum(q.epochs for q in gw.follower.sequencers.values()) >= 2

            # A position from before the restart names logs that are gone: incomplete,
            # and the replay brings what the new logs hold for amy.
            ws = await open_ws(gw, "amy", old_pos)
            got, end = await replay(ws)
            await ws.close()
            assert end["complete"] is False
            assert {"p2p-3", "multicast-3", "broadcast-3"} <= {f["content"] for f in got}
            ws = await open_ws(gw, "amy", frames["amy"][-1]["pos"])
            got, end = await replay(ws)
            await ws.close()
            assert end == {"type": "recovered", "count": 0, "complete": True}
