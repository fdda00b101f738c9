"""Broadcast and multicast against in-process gateways: the clients, what they got, and the
job's end, as their tests share them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from socket_gateway.app import Gateway
from tests.integration.stack import AUTH, ready, token
from tests.waiting import wait_for

__all__ = ["GATEWAYS", "connect_all", "finished", "frames"]

# Two groups of two gateways: (gateway id, group id).
GATEWAYS = [("gw1", "g1"), ("gw2", "g1"), ("gw3", "g2"), ("gw4", "g2")]


async def connect_all(
    stack: AsyncExitStack, gws: Sequence[Gateway], uids: Sequence[str]
) -> dict[str, ClientConnection]:
    """Real WebSocket clients, spread round-robin over the gateways, all registered."""

    async def one(i: int, uid: str) -> ClientConnection:
        url = f"ws://127.0.0.1:{gws[i % len(gws)].ws_port}/ws?token={token(uid)}"
        ws = await stack.enter_async_context(connect(url))
        await ready(ws)
        return ws

    sockets = await asyncio.gather(*(one(i, u) for i, u in enumerate(uids)))
    await wait_for(
        lambda: sum(len(g.conns) for g in gws) >= len(uids), "every client registered", 10
    )
    await asyncio.sleep(0.2)  # the coalesced route writes land
    return dict(zip(uids, sockets, strict=True))


async def frames(sockets: dict[str, ClientConnection], settle: float = 0.5) -> dict[str, list[Any]]:
    """Every frame each client received until the line went quiet for `settle` seconds."""

    async def drain(ws: ClientConnection) -> list[Any]:
        got: list[Any] = []
        while True:
            try:
                got.append(json.loads(await asyncio.wait_for(ws.recv(), settle)))
            except TimeoutError:
                return got

    results = await asyncio.gather(*(drain(ws) for ws in sockets.values()))
    return dict(zip(sockets, results, strict=True))


async def finished(http: httpx.AsyncClient, push_id: str) -> dict[str, Any]:
    for _ in range(200):
        job: dict[str, Any] = (await http.get(f"/v1/pushes/{push_id}", headers=AUTH)).json()
        if job["status"] in ("done", "failed"):
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {push_id} did not finish: {job}")
