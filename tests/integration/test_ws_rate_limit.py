"""Client frames are rate-limited per connection (clients used to be able to send
frames without limit): a gateway with IMROUTE_WS_CLIENT_FRAME_RATE / _BURST, real clients."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from socket_gateway.app import Gateway
from socket_gateway.metrics import render
from tests.integration.stack import RawClient, client, closed_with, gateway, nothing_more, recv_json

pytestmark = pytest.mark.integration

LIMITS: dict[str, Any] = {"ws_client_frame_rate": 10, "ws_client_frame_burst": 5}
PING = '{"type":"ping"}'


async def raw_client(gw: Gateway, uid: str) -> RawClient:
    """A hand-rolled client past its 101 and its replay (its route is written)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.ws_port)
    raw = RawClient(reader, writer)
    writer.write(RawClient.request(uid))
    assert b" 101 " in await raw.response_head()
    opcode, payload = await raw.read_frame()
    assert opcode == 1 and b"recovered" in payload
    return raw


async def test_a_flood_of_text_frames_is_closed_with_1008(redis_url: str, prefix: str) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1", **LIMITS) as gw:
        async with client(gw, "bystander") as bystander, client(gw, "flooder") as ws:
            for _ in range(20):
                await ws.send(PING)
            pongs = 0
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    assert await recv_json(ws) == {"type": "pong"}
                    pongs += 1
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1008
            assert closed.value.rcvd.reason == "too many frames: at most 10/s, burst 5"
            assert pongs <= 5
            assert gw.limit_counts.frame_rate.total == 1
            text = render(gw.metrics).decode()
            assert "imroute_gateway_frame_rate_closes_total 1.0" in text
            # The others are not affected.
            await bystander.send(PING)
            assert await recv_json(bystander) == {"type": "pong"}


async def test_a_client_within_the_rate_is_never_closed(redis_url: str, prefix: str) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1", **LIMITS) as gw, client(gw, "u") as ws:
        for _ in range(5):  # the burst, at once
            await ws.send(PING)
        for _ in range(5):
            assert await recv_json(ws) == {"type": "pong"}
        for _ in range(8):  # then 8/s, under the 10/s rate, for a second
            await asyncio.sleep(0.125)
            await ws.send(PING)
            assert await recv_json(ws) == {"type": "pong"}
        assert await nothing_more(ws, 0.1)
        assert gw.limit_counts.frame_rate.total == 0


async def test_a_ping_flood_is_not_free(redis_url: str, prefix: str) -> None:
    """Control frames count: the library answers each ping with a pong, which we would
    write (and the client need not read)."""
    async with gateway(redis_url, prefix, "gw1", "g1", **LIMITS) as gw:
        raw = await raw_client(gw, "pinger")
        try:
            raw.writer.write(RawClient.frame(0x9, b"flood") * 500)
            pongs = 0
            while True:
                opcode, payload = await raw.read_frame()
                if opcode == 0x8:
                    break
                assert opcode == 0xA
                pongs += 1
            (code,) = struct.unpack("!H", payload[:2])
            assert code == 1008 and b"too many frames" in payload
            assert pongs <= 5
            assert gw.limit_counts.frame_rate.total == 1
        finally:
            raw.close()


async def test_no_limit_when_the_rate_is_zero(redis_url: str, prefix: str) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1", ws_client_frame_rate=0) as gw:
        async with client(gw, "u") as ws:
            for _ in range(200):
                await ws.send(PING)
            for _ in range(200):
                assert await recv_json(ws) == {"type": "pong"}
        async with client(gw, "v") as v:  # an oversized frame is still the library's 1009
            await v.send("x" * 10_000)
            assert (await closed_with(v))[0] == 1009
