"""In-process pieces on real sockets, one helper module for the integration tests:
gateways, the push API and WebSocket clients of them; and a bare WebSocket endpoint
with its Redis registry (`endpoint`), with real `websockets` clients and a raw TCP
one for it (tests/integration/test_ws_*.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Response

from push_service.app import create_app
from router.bus.base import Bus
from router.directory.migrate import upgrade
from router.redis.client import connect_redis
from router.routes.registry import RedisRouteRegistry
from shared.auth import issue_token
from shared.clock import Clock, SystemClock
from shared.ids import ConnIdFactory
from shared.keys import KeySchema
from shared.models import Message
from shared.settings import Settings
from shared.wire import encode_push_json, ws_text_frame
from socket_gateway.app import Gateway
from socket_gateway.connections import LocalConnections
from socket_gateway.faults import FailCalls
from socket_gateway.ws.endpoint import WsEndpoint
from tests.conftest import API_KEY, SECRET
from tests.waiting import wait_for

__all__ = [
    "AUTH",
    "Frame",
    "Gw",
    "RawClient",
    "alice_online",
    "amy_behind_faults",
    "api",
    "api_app",
    "client",
    "closed_with",
    "contents",
    "endpoint",
    "endpoint_client",
    "fanout",
    "gateway",
    "handshake_refused",
    "nothing_more",
    "one_group",
    "p2p",
    "push_frame",
    "push_status",
    "ready",
    "recv_json",
    "route_registry",
    "routes",
    "settings",
    "token",
    "two_groups",
]

AUTH = {"Authorization": f"Bearer {API_KEY}"}

Frame = dict[str, Any]


def settings(redis_url: str, prefix: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "redis_url": redis_url,
        "redis_prefix": prefix,
        "api_key": API_KEY,
        "secret": SECRET,
        "ws_port": 0,
        "grpc_port": 0,
        "deliver_timeout_s": 2.0,
        "gateway_cache_s": 0,
    }
    base.update(overrides)
    return Settings.load({}, **base)


@asynccontextmanager
async def gateway(
    redis_url: str,
    prefix: str,
    gid: str,
    group: str,
    clock: Any = None,
    interceptors: Sequence[Any] = (),
    bus: Bus | None = None,
    **kw: Any,
) -> AsyncIterator[Gateway]:
    s = settings(redis_url, prefix, gateway_id=gid, group_id=group, **kw)
    async with Gateway(s, clock, interceptors, bus=bus) as gw:
        yield gw


@asynccontextmanager
async def api(
    redis_url: str, prefix: str, bus: Bus | None = None, **kw: Any
) -> AsyncIterator[httpx.AsyncClient]:
    async with api_app(redis_url, prefix, bus, **kw) as (client, _):
        yield client


@asynccontextmanager
async def api_app(
    redis_url: str, prefix: str, bus: Bus | None = None, **kw: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    """`api`'s client, and the app it calls."""
    with tempfile.TemporaryDirectory(prefix="imroute-test-db-") as folder:
        if "db_url" not in kw:
            # A migrated SQLite directory of its own.
            kw["db_url"] = f"sqlite+aiosqlite:///{folder}/users.db"
            await upgrade(kw["db_url"])
        app = create_app(settings(redis_url, prefix, **kw), bus=bus)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://push") as client:
                yield client, app


@asynccontextmanager
async def one_group(
    redis_url: str, prefix: str
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    """Gateway gw1 in group g1, and the push API."""
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, api(redis_url, prefix) as http:
        yield gw, http


@asynccontextmanager
async def alice_online(
    redis_url: str, prefix: str
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient, ClientConnection]]:
    """Gateway gw1 in group g1, the push API, and a client of gw1 connected as alice."""
    async with one_group(redis_url, prefix) as (gw, http), client(gw, "alice") as ws:
        yield gw, http, ws


@asynccontextmanager
async def amy_behind_faults(
    redis_url: str, prefix: str, retries: int
) -> AsyncIterator[tuple[FailCalls, Gateway, httpx.AsyncClient, ClientConnection]]:
    """Gateway gw1 whose calls fail when `faults` is armed, the push API retrying a call
    `retries` times, and amy connected to gw1."""
    faults = FailCalls()
    async with (
        gateway(redis_url, prefix, "gw1", "g1", interceptors=[faults]) as gw,
        api(redis_url, prefix, deliver_retries=retries) as http,
        client(gw, "amy") as ws,
    ):
        yield faults, gw, http, ws


@asynccontextmanager
async def two_groups(
    redis_url: str, prefix: str, bus: Bus | None = None, api_bus: Bus | None = None
) -> AsyncIterator[tuple[Gateway, Gateway, httpx.AsyncClient]]:
    """Gateways gw1 in group g1 and gw2 in group g2, and the push API; on `bus` when
    given (the push API on `api_bus`, if that is given too), else each on its own."""
    async with (
        gateway(redis_url, prefix, "gw1", "g1", bus=bus) as gw1,
        gateway(redis_url, prefix, "gw2", "g2", bus=bus) as gw2,
        api(redis_url, prefix, bus=api_bus or bus) as http,
    ):
        yield gw1, gw2, http


def token(uid: str, ttl: int = 3600) -> str:
    return issue_token(SECRET, uid, ttl, SystemClock())


@asynccontextmanager
async def client(gw: Gateway, uid: str) -> AsyncIterator[ClientConnection]:
    """A real WebSocket client connected as `uid` and registered in Redis."""
    async with connect(f"ws://127.0.0.1:{gw.ws_port}/ws?token={token(uid)}") as ws:
        await ready(ws)
        yield ws


async def ready(ws: ClientConnection, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Read a new connection's replay (its inbox, without `since`) up to and including
    the `recovered` frame that ends it; by then its route is in Redis. The replayed
    push frames, in order."""
    replayed: list[dict[str, Any]] = []
    while True:
        frame = await recv_json(ws, timeout)
        if frame["type"] == "recovered":
            assert frame["count"] == len(replayed), (frame, replayed)
            return replayed
        assert frame["type"] == "push" and frame.get("recovered") is True, frame
        replayed.append(frame)


async def recv_json(ws: ClientConnection, timeout: float = 3.0) -> dict[str, Any]:
    data = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(data, str), "pushes are text frames"
    frame: dict[str, Any] = json.loads(data)
    return frame


async def nothing_more(ws: ClientConnection, wait: float = 0.3) -> bool:
    try:
        await asyncio.wait_for(ws.recv(), wait)
    except TimeoutError:
        return True
    return False


async def p2p(http: httpx.AsyncClient, uids: list[str], content: Any, **kw: Any) -> Frame:
    resp = await http.post("/v1/push", json={"to": uids, "content": content, **kw}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    body: Frame = resp.json()
    return body


async def push_status(http: httpx.AsyncClient, push_id: str) -> Frame:
    """GET /v1/pushes/{push_id}: the push's record and counts."""
    resp = await http.get(f"/v1/pushes/{push_id}", headers=AUTH)
    assert resp.status_code == 200, resp.text
    body: Frame = resp.json()
    return body


async def fanout(http: httpx.AsyncClient, path: str, body: Frame) -> str:
    """POST a broadcast or multicast and wait for its job to end; its push id."""
    resp = await http.post(path, json=body, headers=AUTH)
    assert resp.status_code == 202, resp.text
    push_id: str = resp.json()["push_id"]
    for _ in range(500):
        job = await push_status(http, push_id)
        if job["status"] in ("done", "failed"):
            assert job["status"] == "done", job
            return push_id
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {push_id} did not finish")


def contents(frames: list[Frame]) -> list[Any]:
    return [f["content"] for f in frames]


# ------------------------------------------------------------------ a bare endpoint

Registrar = Callable[[str, str], Awaitable[None]]


@dataclass
class Gw:
    """A bare WebSocket endpoint (no gRPC, no bus) on a free loopback port, with its
    map and Redis registry."""

    endpoint: Any
    server: Any
    conns: LocalConnections
    registry: RedisRouteRegistry
    keys: KeySchema
    port: int
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    def url(self, query: str = "", path: str = "/ws") -> str:
        return f"ws://127.0.0.1:{self.port}{path}{query}"

    async def let_go(self, what: str = "removal") -> None:
        """Wait until every connection has left the map, and an unregister was tried."""
        await wait_for(lambda: len(self.conns) == 0, what)
        await wait_for(lambda: any(c[0] == "unregister" for c in self.calls), "unregister")


@asynccontextmanager
async def endpoint(
    redis_url: str,
    prefix: str,
    *,
    register: Registrar | None = None,
    unregister: Registrar | None = None,
    **options: Any,
) -> AsyncIterator[Gw]:
    """`register`, `unregister`: in place of the registry's own; `options`: the endpoint's
    (`WsEndpoint`'s keywords: timers, limits, token_rules, max_connections, ...)."""
    async with connect_redis(redis_url) as redis:
        keys = KeySchema(prefix)
        registry = route_registry(redis, prefix, "gw1", group_id="g1", port=5000)
        calls: list[tuple[str, str, str]] = []

        async def reg(uid: str, conn_id: str) -> None:
            calls.append(("register", uid, conn_id))
            await (register or registry.register)(uid, conn_id)
            calls.append(("registered", uid, conn_id))

        async def unreg(uid: str, conn_id: str) -> None:
            calls.append(("unregister", uid, conn_id))
            await (unregister or registry.unregister)(uid, conn_id)

        conns = LocalConnections()
        ep = WsEndpoint(
            conns,
            SECRET,
            SystemClock(),
            ConnIdFactory("gw1"),
            reg,
            unreg,
            **options,
        )
        server = await ep.serve("127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        gw = Gw(ep, server, conns, registry, keys, port, calls)
        try:
            yield gw
        finally:
            ep.accepting = False
            server.close(close_connections=True)
            await asyncio.wait_for(server.wait_closed(), 10)


def route_registry(
    redis: Any, prefix: str, gw: str, clock: Clock | None = None, **options: Any
) -> RedisRouteRegistry:
    """The route registry of gateway `gw` (a name ending in a digit): in group
    `group-of-<gw>`, at 127.0.0.1 port 9000 + that digit, routes kept 60 s, unless
    `options` (RedisRouteRegistry's) say otherwise."""
    defaults: dict[str, Any] = {
        "ttl_s": 60,
        "group_id": f"group-of-{gw}",
        "ip": "127.0.0.1",
        "port": 9000 + int(gw[-1]),
    }
    return RedisRouteRegistry(
        redis, KeySchema(prefix), clock or SystemClock(), gateway_id=gw, **(defaults | options)
    )


async def routes(redis: Any, gw: Gw, uid: str) -> dict[str, str]:
    fields: dict[str, str] = await redis.hgetall(gw.keys.route(uid))
    return fields


@asynccontextmanager
async def endpoint_client(gw: Gw, uid: str) -> AsyncIterator[ClientConnection]:
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


async def closed_with(ws: ClientConnection, timeout: float = 3.0) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        while True:  # skip anything still in flight before the close
            await asyncio.wait_for(ws.recv(), timeout)
    assert closed.value.rcvd is not None, "the server sent no close frame"
    return closed.value.rcvd.code, closed.value.rcvd.reason


async def handshake_refused(url: str, **kw: Any) -> Response:
    """The HTTP answer that refused a WebSocket handshake to `url` (`kw`: connect's)."""
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, **kw):
            pass
    return info.value.response


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
    async def open(cls, gw: Gw, source: str = "127.0.0.1") -> RawClient:
        """Connected from `source` (any address of 127/8 is loopback)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port, local_addr=(source, 0))
        return cls(reader, writer)

    @staticmethod
    def request(uid: str, path: str = "/ws", query: str | None = None, extra: str = "") -> bytes:
        """A handshake for `uid` (its token in the query unless `query` is given);
        `extra`: more header lines, each ending in CRLF."""
        key = base64.b64encode(os.urandom(16)).decode()
        q = f"?token={token(uid)}" if query is None else query
        return (
            f"GET {path}{q} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\n{extra}"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()

    async def response(self, timeout: float = 3.0) -> tuple[bytes, bytes]:
        """The head of an HTTP answer and its Content-Length body."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout)
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await asyncio.wait_for(self.reader.readexactly(length), timeout)
        return head, body

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
