"""The endpoint's shutdown (socket_gateway/ws/endpoint.py): 1001, unregisters, bounded."""

from __future__ import annotations

import asyncio
import struct
from contextlib import AsyncExitStack
from typing import Any

import pytest

from socket_gateway.ws.protocol import WsTimers
from tests.integration.stack import RawClient, closed_with, endpoint, endpoint_client, routes
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def test_shutdown_closes_clients_1001_and_unregisters(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with endpoint(redis_url, prefix) as gw:
        async with AsyncExitStack() as stack:
            sockets = [
                await stack.enter_async_context(endpoint_client(gw, f"u{i}")) for i in range(5)
            ]
            assert all([await routes(redis, gw, f"u{i}") for i in range(5)])
            gw.endpoint.accepting = False
            gw.server.close(close_connections=True)
            await asyncio.wait_for(gw.server.wait_closed(), 8)
            for ws in sockets:
                code, _ = await closed_with(ws)
                assert code == 1001
            assert len(gw.conns) == 0
            assert sum(c[0] == "unregister" for c in gw.calls) == 5
            for i in range(5):
                assert await routes(redis, gw, f"u{i}") == {}
            # No longer listening.
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", gw.port)


async def test_shutdown_is_bounded_for_clients_that_never_answer(
    redis_url: str, prefix: str
) -> None:
    async with endpoint(redis_url, prefix, timers=WsTimers(shutdown_s=0.5)) as gw:
        raw = await RawClient.open(gw)
        raw.writer.write(RawClient.request("mute"))
        assert b" 101 " in await raw.response_head()
        await wait_for(lambda: any(c[0] == "registered" for c in gw.calls), "registered")
        started = asyncio.get_running_loop().time()
        gw.server.close(close_connections=True)
        await asyncio.wait_for(gw.server.wait_closed(), 5)
        assert asyncio.get_running_loop().time() - started < 2.0
        opcode, payload = await raw.read_frame()
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1001
        assert len(gw.conns) == 0 and not gw.endpoint._live
        assert [c[0] for c in gw.calls] == ["register", "registered", "unregister"]
        raw.close()
