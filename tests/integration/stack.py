"""In-process pieces on real sockets: gateways, the push API, WebSocket clients."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from push_service.app import create_app
from router.bus.base import Bus
from router.directory.migrate import upgrade
from shared.auth import issue_token
from shared.clock import SystemClock
from shared.settings import Settings
from socket_gateway.app import Gateway
from tests.conftest import API_KEY, SECRET

AUTH = {"Authorization": f"Bearer {API_KEY}"}


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
    with tempfile.TemporaryDirectory(prefix="imroute-test-db-") as folder:
        if "db_url" not in kw:
            # A migrated SQLite directory of its own.
            kw["db_url"] = f"sqlite+aiosqlite:///{folder}/users.db"
            await upgrade(kw["db_url"])
        app = create_app(settings(redis_url, prefix, **kw), bus=bus)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://push") as client:
                yield client


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


async def wait_for(cond: Any, what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


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
