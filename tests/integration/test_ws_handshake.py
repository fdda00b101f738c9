"""The WebSocket endpoint's opening handshake (socket_gateway/ws/handshake.py): HTTP
answers, the token (4401), deadlines, and the route registered after the 101."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from router.routes.registry import RedisRouteRegistry
from shared.clock import SystemClock
from shared.errors import RegistryUnavailable
from socket_gateway.ws import WsTimers
from tests.conftest import SECRET
from tests.integration.ws_helpers import (
    RawClient,
    client,
    closed_with,
    gateway,
    recv_json,
    routes,
    token,
    wait_for,
)

pytestmark = pytest.mark.integration


# --------------------------------------------------------------------------- auth


@pytest.mark.parametrize("bad", ["none", "garbage", "expired", "wrong-secret", "no-sub"])
async def test_bad_tokens_close_4401_before_registering(
    redis_url: str, prefix: str, redis: Any, bad: str
) -> None:
    now = SystemClock().now_ms() // 1000
    tokens = {
        "none": "",
        "garbage": "?token=not.a.jwt",
        "expired": "?token=" + jwt.encode({"sub": "alice", "exp": now - 5}, SECRET, "HS256"),
        "wrong-secret": "?token=" + jwt.encode({"sub": "alice", "exp": 2**40}, "w" * 32, "HS256"),
        "no-sub": "?token=" + jwt.encode({"exp": 2**40}, SECRET, "HS256"),
    }
    async with gateway(redis_url, prefix) as gw:
        async with connect(gw.url(tokens[bad])) as ws:
            code, reason = await closed_with(ws)
        assert code == 4401
        assert reason  # says why
        assert len(gw.conns) == 0 and gw.calls == []
        assert await redis.exists(gw.keys.route("alice")) == 0


# --------------------------------------------------------------------------- HTTP


async def test_wrong_path_is_404_with_a_text_body(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw:
        with pytest.raises(InvalidStatus) as info:
            async with connect(gw.url(f"?token={token('a')}", path="/other")):
                pass
        assert info.value.response.status_code == 404
        assert b"/ws?token=" in info.value.response.body
        assert len(gw.conns) == 0


async def test_not_accepting_is_503(redis_url: str, prefix: str, redis: Any) -> None:
    async with gateway(redis_url, prefix) as gw:
        gw.endpoint.accepting = False
        with pytest.raises(InvalidStatus) as info:
            async with connect(gw.url(f"?token={token('a')}")):
                pass
        assert info.value.response.status_code == 503
        assert gw.calls == []


async def test_plain_http_request_is_refused(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw:
        raw = await RawClient.open(gw)
        raw.writer.write(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await raw.response_head()
        assert head.startswith(b"HTTP/1.1 426 ")
        raw.close()
        raw = await RawClient.open(gw)
        raw.writer.write(b"\x16\x03\x01 not http at all\r\n\r\n")
        assert await raw.at_eof()
        raw.close()
        await wait_for(lambda: len(gw.conns) == 0, "nothing registered")
        assert gw.calls == []


async def test_oversized_handshake_is_431(redis_url: str, prefix: str, redis: Any) -> None:
    async with gateway(redis_url, prefix) as gw:
        raw = await RawClient.open(gw)
        raw.writer.write(b"GET /ws HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20_000)
        head = await raw.response_head()
        assert head.startswith(b"HTTP/1.1 431 ")
        raw.close()
        await wait_for(lambda: not gw.endpoint._live, "dropped")


async def test_handshake_and_frames_in_one_segment(redis_url: str, prefix: str, redis: Any) -> None:
    # Clients should wait for the 101 (RFC 6455 4.1); the `websockets` server writes its
    # pong to a pipelined ping before the 101, so this is checked on the sans-I/O one only.
    async with gateway(redis_url, prefix) as gw:
        raw = await RawClient.open(gw)
        ping = RawClient.frame(0x1, b'{"type":"ping"}')
        raw.writer.write(RawClient.request("alice") + ping + RawClient.frame(0x9, b"p"))
        assert b" 101 " in await raw.response_head()
        frames = {await raw.read_frame(), await raw.read_frame()}
        assert frames == {(0x1, b'{"type":"pong"}'), (0xA, b"p")}
        # A close from the client is echoed and the connection ends.
        raw.writer.write(RawClient.frame(0x8, struct.pack("!H", 1000) + b"bye"))
        assert await raw.read_frame() == (0x8, struct.pack("!H", 1000) + b"bye")
        assert await raw.at_eof()
        raw.close()
        await wait_for(lambda: len(gw.conns) == 0, "removal")
        await wait_for(lambda: any(c[0] == "unregister" for c in gw.calls), "unregister")


# --------------------------------------------------------------------------- deadline


async def test_a_client_that_never_finishes_the_handshake_is_dropped(
    redis_url: str, prefix: str, redis: Any
) -> None:
    timers = WsTimers(handshake_s=0.3)
    async with (
        gateway(redis_url, prefix, timers=timers) as gw,
        client(gw, "bystander") as bystander,
    ):
        silent = await RawClient.open(gw)
        partial = await RawClient.open(gw)
        partial.writer.write(RawClient.request("slowpoke")[:40])
        await wait_for(lambda: len(gw.endpoint._live) == 3, "both accepted")
        for raw in (silent, partial):
            assert await raw.dropped(2)
            raw.close()
        await wait_for(lambda: len(gw.endpoint._live) == 1, "dropped")
        assert [c.uid for c in gw.conns] == ["bystander"]
        # The bystander, past its own handshake long ago, is not affected.
        await bystander.send('{"type":"ping"}')
        assert await recv_json(bystander) == {"type": "pong"}


# --------------------------------------------------------------------------- routes


async def test_register_then_disconnect_removes_the_route(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw:
        async with client(gw, "alice"):
            (conn,) = list(gw.conns)
            fields = await routes(redis, gw, "alice")
            assert list(fields) == [conn.conn_id]
            assert fields[conn.conn_id].startswith("gw1|g1|127.0.0.1|5000|")
            found = await gw.registry.lookup(["alice"])
            assert [r.conn_id for r in found["alice"]] == [conn.conn_id]
        await wait_for(lambda: len(gw.conns) == 0, "local removal")
        await wait_for(lambda: any(c[0] == "unregister" for c in gw.calls), "unregister")
        await asyncio.sleep(0.05)
        assert await routes(redis, gw, "alice") == {}


async def test_registry_down_closes_1013(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async def down(uid: str, conn_id: str) -> None:
        raise RegistryUnavailable("redis did not answer: test")

    async with gateway(redis_url, prefix, register=down, unregister=down) as gw:
        async with connect(gw.url(f"?token={token('alice')}")) as ws:
            code, _ = await closed_with(ws)
        assert code == 1013
        await wait_for(lambda: len(gw.conns) == 0, "removal")
        # The unregister was attempted (and its failure only logged).
        await wait_for(lambda: any(c[0] == "unregister" for c in gw.calls), "unregister")


async def test_client_gone_during_register_is_unregistered_after_it(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    release = asyncio.Event()
    holder: dict[str, RedisRouteRegistry] = {}

    async def slow(uid: str, conn_id: str) -> None:
        await release.wait()
        await holder["registry"].register(uid, conn_id)

    async with gateway(redis_url, prefix, register=slow) as gw:
        holder["registry"] = gw.registry
        raw = await RawClient.open(gw)
        raw.writer.write(RawClient.request("alice"))
        assert b" 101 " in await raw.response_head()
        await wait_for(lambda: len(gw.conns) == 1, "in the map")
        raw.close()  # TCP reset while the register is in flight
        await wait_for(lambda: len(gw.conns) == 0, "local removal")
        await asyncio.sleep(0.2)
        assert [c[0] for c in gw.calls] == ["register"]  # no unregister overtaking it
        release.set()
        await wait_for(lambda: [c[0] for c in gw.calls][-1:] == ["unregister"], "unregister")
        assert [c[0] for c in gw.calls] == ["register", "registered", "unregister"]
        assert len(gw.conns) == 0
        await asyncio.sleep(0.05)
        assert await routes(redis, gw, "alice") == {}
