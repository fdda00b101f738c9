"""The frame phase of a connection (socket_gateway/ws/conn.py): client frames, pushes
written as pre-built frames, and write-side limits."""

from __future__ import annotations

import asyncio
import logging
import struct
from types import SimpleNamespace
from typing import Any

import pytest

from shared.wire import ws_text_frame
from tests.integration.stack import (
    RawClient,
    closed_with,
    endpoint,
    endpoint_client,
    nothing_more,
    push_frame,
    recv_json,
    routes,
)
from tests.integration.stack import gateway as stack_gateway
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


# --------------------------------------------------------------------------- frames


async def test_ping_pong_and_junk_frames_spare_the_bystander(
    redis_url: str,
    prefix: str,
) -> None:
    async with endpoint(redis_url, prefix) as gw:
        async with endpoint_client(gw, "bystander") as bystander:
            cases: list[tuple[str | bytes, int]] = [
                ("not json", 1008),
                ('{"type":"push"}', 1008),
                ("[1,2]", 1008),
                ("[" * 2000, 1008),  # deeper than any JSON parser's stack
                (b"\x00\x01", 1003),
                ("x" * 10_000, 1009),  # over the 4096-byte client frame limit
            ]
            for junk, code in cases:
                async with endpoint_client(gw, "junky") as ws:
                    await ws.send('{"type":"ping"}')
                    assert await recv_json(ws) == {"type": "pong"}
                    await ws.send(junk)
                    got, reason = await closed_with(ws)
                    assert got == code, (junk[:20], got, reason)
                    if code == 1008:
                        assert "ping" in reason or "JSON" in reason
                await wait_for(lambda: not any(c.uid == "junky" for c in gw.conns), "junky gone")
            await bystander.send('{"type":"ping"}')
            assert await recv_json(bystander) == {"type": "pong"}
            frame, expected = push_frame("still here")
            assert gw.conns.write_to(["bystander"], frame) == (["bystander"], [])
            assert await recv_json(bystander) == expected
            assert await nothing_more(bystander)


async def test_fragmented_ping_is_reassembled(
    redis_url: str,
    prefix: str,
) -> None:
    async with endpoint(redis_url, prefix) as gw, endpoint_client(gw, "alice") as ws:
        await ws.send(['{"type"', ':"ping"', "}"])
        assert await recv_json(ws) == {"type": "pong"}


async def test_invalid_utf8_text_is_1007(
    redis_url: str,
    prefix: str,
) -> None:
    async with endpoint(redis_url, prefix) as gw, endpoint_client(gw, "alice"):
        raw = await RawClient.open(gw)
        raw.writer.write(RawClient.request("bob"))
        assert b" 101 " in await raw.response_head()
        await wait_for(lambda: any(c.uid == "bob" for c in gw.conns), "bob in the map")
        raw.writer.write(RawClient.frame(0x1, b'{"type":"\xff"}'))
        opcode, payload = await raw.read_frame()
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1007
        raw.close()
        await wait_for(lambda: not any(c.uid == "bob" for c in gw.conns), "bob gone")


async def test_websocket_pings_are_answered(
    redis_url: str,
    prefix: str,
) -> None:
    async with endpoint(redis_url, prefix) as gw, endpoint_client(gw, "alice") as ws:
        pong = await ws.ping(b"hello")
        assert await asyncio.wait_for(pong, 3) >= 0


# --------------------------------------------------------------------------- pushes


async def test_multi_device_each_connection_has_its_route_and_gets_the_push(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with endpoint(redis_url, prefix) as gw:
        async with endpoint_client(gw, "alice") as phone, endpoint_client(gw, "alice") as tablet:
            async with endpoint_client(gw, "bob") as other:
                ids = sorted(c.conn_id for c in gw.conns if c.uid == "alice")
                assert len(ids) == 2 and len(gw.conns) == 3
                assert sorted(await routes(redis, gw, "alice")) == ids
                frame, expected = push_frame("hi both")
                delivered, missing = gw.conns.write_to(["alice", "nobody"], frame)
                assert (delivered, missing) == (["alice"], ["nobody"])
                assert await recv_json(phone) == expected
                assert await recv_json(tablet) == expected
                assert await nothing_more(other, 0.2)
            # One device leaves: only its route goes.
            await tablet.close()
            await wait_for(lambda: len(gw.conns) == 1, "tablet removed")
            await wait_for(lambda: sum(c[0] == "unregister" for c in gw.calls) == 2, "unreg")
            # The removal is written by the coalesced route writer: wait for it to land.
            for _ in range(250):
                left = await routes(redis, gw, "alice")
                if len(left) < 2:
                    break
                await asyncio.sleep(0.02)
            assert len(left) == 1 and next(iter(left)) in ids
            assert gw.conns.write_to(["alice"], frame)[0] == ["alice"]
            assert await recv_json(phone) == expected


async def test_prebuilt_frame_reaches_the_client_exactly_once(
    redis_url: str,
    prefix: str,
) -> None:
    async with endpoint(redis_url, prefix) as gw, endpoint_client(gw, "ünï") as ws:
        frame, expected = push_frame("héllo 👋")
        assert gw.conns.write_to(["ünï"], frame) == (["ünï"], [])
        assert await recv_json(ws) == expected
        assert await nothing_more(ws)
        # And many frames keep their order.
        for i in range(200):
            gw.conns.write_to(["ünï"], ws_text_frame(b'{"n":%d}' % i))
        assert [(await recv_json(ws))["n"] for _ in range(200)] == list(range(200))


async def test_client_that_stops_reading_is_aborted_not_buffered(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What a slow consumer had unsent is lost to it: never without a count and a line."""
    async with stack_gateway(redis_url, prefix, "g1", "grp", max_write_buffer=64 * 1024) as gw:
        raw = await RawClient.open(SimpleNamespace(port=gw.ws_port))  # type: ignore[arg-type]
        raw.writer.transport.pause_reading()  # type: ignore[attr-defined]
        raw.writer.write(RawClient.request("hog"))
        await wait_for(lambda: len(gw.conns) == 1, "in the map")
        big = ws_text_frame(b"x" * 60_000)
        with caplog.at_level(logging.WARNING, "socket_gateway.app"):
            for _ in range(400):  # ~24 MB: far past any socket buffer
                gw.conns.write_to(["hog"], big)
                if len(gw.conns) == 0 or gw.conns.slow_aborted:
                    break
                await asyncio.sleep(0)
            await wait_for(lambda: len(gw.conns) == 0, "slow consumer aborted")
        assert gw.conns.slow_aborted == 1
        assert gw.counts()["slow_consumers_aborted"][1] == 1  # in /metrics
        [line] = [r.getMessage() for r in caplog.records if "slow consumer" in r.getMessage()]
        assert line.startswith("aborted 1 slow consumer(s) since the last line: more than 65536")
        raw.close()
