"""The Python SDK (imroute-client) against an in-process stack: what its tests share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import redis.asyncio as aioredis
from imroute_client import ImrouteClient, Message

from shared.keys import KeySchema
from tests.integration.stack import AUTH
from tests.waiting import wait_for

__all__ = ["API", "drain", "next_message", "pumping", "push", "registered"]

API = "http://push"  # the in-process API's base URL (httpx's ASGI transport)


async def registered(redis: aioredis.Redis, prefix: str, uid: str) -> None:
    """Until `uid` has a route (route writes are coalesced)."""
    route = KeySchema(prefix).route(uid)
    await wait_for(lambda: redis.hlen(route), f"{uid}'s route", every=0.02)


async def push(http: httpx.AsyncClient, uid: str, content: object) -> list[str]:
    resp = await http.post("/v1/push", json={"to": [uid], "content": content}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    delivered: list[str] = resp.json()["delivered"]
    return delivered


async def drain(http: httpx.AsyncClient, gateway_id: str) -> None:
    """Ask `gateway_id` to drain. A 409 (the last live gateway of its group) means the
    API missed its peer's heartbeat (0.2 s here, late under load): ask again."""
    for _ in range(100):
        resp = await http.post(f"/v1/gateways/{gateway_id}/drain", headers=AUTH)
        if resp.status_code != 409:
            break
        await asyncio.sleep(0.05)
    assert resp.status_code == 202, resp.text


async def next_message(client: ImrouteClient, timeout: float = 5.0) -> Message:
    return await asyncio.wait_for(anext(client), timeout)


@contextlib.asynccontextmanager
async def pumping(client: ImrouteClient) -> AsyncIterator[list[Message]]:
    """The client's messages, read by a task into a list, while the block runs."""
    got: list[Message] = []

    async def pump() -> None:
        async for msg in client:
            got.append(msg)

    task = asyncio.create_task(pump())
    try:
        yield got
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
