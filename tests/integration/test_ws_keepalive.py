"""The gateway-wide keepalive round (socket_gateway/ws/conn.py)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from socket_gateway.ws.protocol import WsTimers
from tests.integration.stack import RawClient, endpoint, endpoint_client, recv_json
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def test_keepalive_pings_and_closes_silent_clients(redis_url: str, prefix: str) -> None:
    timers = WsTimers(ping_interval_s=0.2, close_s=0.5)
    async with (
        endpoint(redis_url, prefix, timers=timers) as gw,
        endpoint_client(gw, "lively") as lively,
    ):
        raw = await RawClient.open(gw)
        raw.writer.write(RawClient.request("mute"))
        assert b" 101 " in await raw.response_head()
        # It is pinged, never answers, gets 1011, and is aborted when it ignores that too.
        assert await raw.read_frame(2) == (0x9, b"")
        opcode, payload = await raw.read_frame(2)
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1011
        await wait_for(lambda: not any(c.uid == "mute" for c in gw.conns), "mute dropped")
        await wait_for(lambda: any(c[:2] == ("unregister", "mute") for c in gw.calls), "unreg")
        raw.close()
        # The `websockets` client answers the pings by itself and stays.
        await asyncio.sleep(1.0)
        await lively.send('{"type":"ping"}')
        assert await recv_json(lively) == {"type": "pong"}
        assert [c.uid for c in gw.conns] == ["lively"]
