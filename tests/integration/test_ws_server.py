"""The gateway's WebSocket endpoint against real `websockets` clients, raw sockets and Redis."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import jwt
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from router.redis.client import connect_redis
from router.routes.registry import RedisRouteRegistry
from shared.auth import issue_token
from shared.clock import SystemClock
from shared.errors import RegistryUnavailable
from shared.ids import ConnIdFactory
from shared.keys import KeySchema
from shared.models import Message
from shared.wire import encode_push_json, ws_text_frame
from socket_gateway.connections import LocalConnections
from socket_gateway.ws import WsEndpoint, WsTimers
from tests.conftest import SECRET

pytestmark = pytest.mark.integration

Registrar = Callable[[str, str], Awaitable[None]]


@dataclass
class Gw:
    """One endpoint serving on a free loopback port, with its map and Redis registry."""

    endpoint: Any
    server: Any
    conns: LocalConnections
    registry: RedisRouteRegistry
    keys: KeySchema
    port: int
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    def url(self, query: str = "", path: str = "/ws") -> str:
        return f"ws://127.0.0.1:{self.port}{path}{query}"


@asynccontextmanager
async def gateway(
    redis_url: str,
    prefix: str,
    *,
    register: Registrar | None = None,
    unregister: Registrar | None = None,
    timers: WsTimers | None = None,
) -> AsyncIterator[Gw]:
    async with connect_redis(redis_url) as redis:
        keys = KeySchema(prefix)
        registry = RedisRouteRegistry(
            redis,
            keys,
            SystemClock(),
            ttl_s=60,
            gateway_id="gw1",
            group_id="g1",
            ip="127.0.0.1",
            port=5000,
        )
        calls: list[tuple[str, str, str]] = []

        async def reg(uid: str, conn_id: str) -> None:
            calls.append(("register", uid, conn_id))
            await (register or registry.register)(uid, conn_id)
            calls.append(("registered", uid, conn_id))

        async def unreg(uid: str, conn_id: str) -> None:
            calls.append(("unregister", uid, conn_id))
            await (unregister or registry.unregister)(uid, conn_id)

        conns = LocalConnections()
        endpoint = WsEndpoint(
            conns, SECRET, SystemClock(), ConnIdFactory("gw1"), reg, unreg, timers
        )
        server = await endpoint.serve("127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        gw = Gw(endpoint, server, conns, registry, keys, port, calls)
        try:
            yield gw
        finally:
            endpoint.accepting = False
            server.close(close_connections=True)
            await asyncio.wait_for(server.wait_closed(), 10)


def token(uid: str, ttl: int = 3600) -> str:
    return issue_token(SECRET, uid, ttl, SystemClock())


async def wait_for(cond: Callable[[], Any], what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def routes(redis: Any, gw: Gw, uid: str) -> dict[str, str]:
    fields: dict[str, str] = await redis.hgetall(gw.keys.route(uid))
    return fields


@asynccontextmanager
async def client(gw: Gw, uid: str) -> AsyncIterator[ClientConnection]:
    """A real client connected as `uid`, in the local map and registered in Redis."""
    before = sum(1 for c in gw.conns if c.uid == uid)
    async with connect(gw.url(f"?token={token(uid)}")) as ws:
        await wait_for(
            lambda: sum(1 for c in gw.conns if c.uid == uid) > before, f"{uid} in the map"
        )
        await wait_for(
            lambda: sum(1 for c in gw.calls if c[0] == "registered" and c[1] == uid) > before,
            f"{uid} registered",
        )
        yield ws


async def recv_json(ws: ClientConnection, timeout: float = 3.0) -> dict[str, Any]:
    data = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(data, str), "pushes are text frames"
    frame: dict[str, Any] = json.loads(data)
    return frame


async def closed_with(ws: ClientConnection, timeout: float = 3.0) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        while True:  # skip anything still in flight before the close
            await asyncio.wait_for(ws.recv(), timeout)
    assert closed.value.rcvd is not None, "the server sent no close frame"
    return closed.value.rcvd.code, closed.value.rcvd.reason


async def nothing_more(ws: ClientConnection, wait: float = 0.3) -> bool:
    try:
        await asyncio.wait_for(ws.recv(), wait)
    except TimeoutError:
        return True
    return False


def push_frame(text: str) -> tuple[bytes, dict[str, Any]]:
    msg = Message("m1", "p1", 3, "admin", json.dumps({"text": text}).encode(), 1_700_000_000_123)
    payload = encode_push_json(msg)
    return ws_text_frame(payload), json.loads(payload)


# --------------------------------------------------------------------------- raw client


class RawClient:
    """A hand-rolled client on a plain TCP socket, for what `websockets` would not do."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, gw: Gw) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        return cls(reader, writer)

    @staticmethod
    def request(uid: str, path: str = "/ws") -> bytes:
        key = base64.b64encode(os.urandom(16)).decode()
        return (
            f"GET {path}?token={token(uid)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()

    @staticmethod
    def frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([(0x80 if fin else 0) | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        else:
            head += struct.pack("!BH", 0x80 | 126, n)
        return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

    async def response_head(self) -> bytes:
        return await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 3)

    async def read_frame(self, timeout: float = 3.0) -> tuple[int, bytes]:
        head = await asyncio.wait_for(self.reader.readexactly(2), timeout)
        n = head[1] & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self.reader.readexactly(2))
        return head[0] & 0x0F, await self.reader.readexactly(n)

    async def at_eof(self, timeout: float = 3.0) -> bool:
        rest = await asyncio.wait_for(self.reader.read(), timeout)
        return rest == b""

    async def dropped(self, timeout: float = 3.0) -> bool:
        """The server aborted the connection: a reset, or EOF without a byte."""
        try:
            rest = await asyncio.wait_for(self.reader.read(), timeout)
        except ConnectionResetError:
            return True
        return rest == b""

    def close(self) -> None:
        self.writer.transport.abort()


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


# --------------------------------------------------------------------------- frames


async def test_ping_pong_and_junk_frames_spare_the_bystander(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw:
        async with client(gw, "bystander") as bystander:
            cases: list[tuple[str | bytes, int]] = [
                ("not json", 1008),
                ('{"type":"push"}', 1008),
                ("[1,2]", 1008),
                (b"\x00\x01", 1003),
                ("x" * 10_000, 1009),  # over the 4096-byte client frame limit
            ]
            for junk, code in cases:
                async with client(gw, "junky") as ws:
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
            assert gw.conns.deliver(["bystander"], frame) == (["bystander"], [])
            assert await recv_json(bystander) == expected
            assert await nothing_more(bystander)


async def test_fragmented_ping_is_reassembled(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw, client(gw, "alice") as ws:
        await ws.send(['{"type"', ':"ping"', "}"])
        assert await recv_json(ws) == {"type": "pong"}


async def test_invalid_utf8_text_is_1007(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw, client(gw, "alice"):
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
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw, client(gw, "alice") as ws:
        pong = await ws.ping(b"hello")
        assert await asyncio.wait_for(pong, 3) >= 0


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


async def test_multi_device_each_connection_has_its_route_and_gets_the_push(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw:
        async with client(gw, "alice") as phone, client(gw, "alice") as tablet:
            async with client(gw, "bob") as other:
                ids = sorted(c.conn_id for c in gw.conns if c.uid == "alice")
                assert len(ids) == 2 and len(gw.conns) == 3
                assert sorted(await routes(redis, gw, "alice")) == ids
                frame, expected = push_frame("hi both")
                delivered, missing = gw.conns.deliver(["alice", "nobody"], frame)
                assert (delivered, missing) == (["alice"], ["nobody"])
                assert await recv_json(phone) == expected
                assert await recv_json(tablet) == expected
                assert await nothing_more(other, 0.2)
            # One device leaves: only its route goes.
            await tablet.close()
            await wait_for(lambda: len(gw.conns) == 1, "tablet removed")
            await wait_for(lambda: sum(c[0] == "unregister" for c in gw.calls) == 2, "unreg")
            left = await routes(redis, gw, "alice")
            assert len(left) == 1 and next(iter(left)) in ids
            assert gw.conns.deliver(["alice"], frame)[0] == ["alice"]
            assert await recv_json(phone) == expected


async def test_prebuilt_frame_reaches_the_client_exactly_once(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw, client(gw, "ünï") as ws:
        frame, expected = push_frame("héllo 👋")
        assert gw.conns.deliver(["ünï"], frame) == (["ünï"], [])
        assert await recv_json(ws) == expected
        assert await nothing_more(ws)
        # And many frames keep their order.
        for i in range(200):
            gw.conns.deliver(["ünï"], ws_text_frame(b'{"n":%d}' % i))
        assert [(await recv_json(ws))["n"] for _ in range(200)] == list(range(200))


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


# --------------------------------------------------------------------------- shutdown


async def test_shutdown_closes_clients_1001_and_unregisters(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with gateway(redis_url, prefix) as gw:
        async with AsyncExitStack() as stack:
            sockets = [await stack.enter_async_context(client(gw, f"u{i}")) for i in range(5)]
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
    redis_url: str, prefix: str, redis: Any
) -> None:
    async with gateway(redis_url, prefix, timers=WsTimers(shutdown_s=0.5)) as gw:
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


# --------------------------------------------------------------------------- timers


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


async def test_keepalive_pings_and_closes_silent_clients(
    redis_url: str, prefix: str, redis: Any
) -> None:
    timers = WsTimers(ping_interval_s=0.2, close_s=0.5)
    async with gateway(redis_url, prefix, timers=timers) as gw, client(gw, "lively") as lively:
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


async def test_oversized_handshake_is_431(redis_url: str, prefix: str, redis: Any) -> None:
    async with gateway(redis_url, prefix) as gw:
        raw = await RawClient.open(gw)
        raw.writer.write(b"GET /ws HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20_000)
        head = await raw.response_head()
        assert head.startswith(b"HTTP/1.1 431 ")
        raw.close()
        await wait_for(lambda: not gw.endpoint._live, "dropped")


async def test_client_that_stops_reading_is_aborted_not_buffered(
    redis_url: str, prefix: str, redis: Any
) -> None:
    async with gateway(redis_url, prefix) as gw:
        gw.conns.max_buffer = 64 * 1024
        raw = await RawClient.open(gw)
        raw.writer.transport.pause_reading()  # type: ignore[attr-defined]
        raw.writer.write(RawClient.request("hog"))
        await wait_for(lambda: len(gw.conns) == 1, "in the map")
        big = ws_text_frame(b"x" * 60_000)
        for _ in range(400):  # ~24 MB: far past any socket buffer
            gw.conns.deliver(["hog"], big)
            if len(gw.conns) == 0 or gw.conns.slow_aborted:
                break
            await asyncio.sleep(0)
        await wait_for(lambda: len(gw.conns) == 0, "slow consumer aborted")
        assert gw.conns.slow_aborted >= 1
        raw.close()
