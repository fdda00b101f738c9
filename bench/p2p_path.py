"""The modules a P2P push crosses, from the HTTP request to the socket write, and those
it crosses only after (the gateway's answer, the receipt, the HTTP answer).

    .venv/bin/python -m bench.p2p_path [--redis-url URL] [--cache-s S]

An in-process push service (its ASGI app, every middleware) and gateway on a real Redis
(IMROUTE_REDIS_URL, else 127.0.0.1:6379, else an embedded one), with default settings
and one real WebSocket client, which acks what it gets (outside the watch).
`sys.setprofile` watches three pushes, after two to warm up, and lists the modules of
ours (shared, router, push_service, socket_gateway) whose functions run in all three: up
to the client's socket write (`socket_gateway/ws/conn.py` `write`), then after it.
`shared` is counted apart: it is the leaf every process imports (models, wire formats,
keys, clock)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from push_service.app import create_app
from router.directory.migrate import upgrade
from router.processes.embedded_redis import EmbeddedRedis, redis_answers
from shared.auth import issue_token
from shared.clock import SystemClock
from shared.settings import Settings
from socket_gateway.app import Gateway

ROOT = str(Path(__file__).resolve().parent.parent) + os.sep
PACKAGES = ("shared", "router", "push_service", "socket_gateway")
WRITE = ("socket_gateway/ws/conn.py", "write")
KEY = "bench-api-key-0123456789"
SECRET = "bench-secret-0123456789abcdef0123456789"


def settings(redis_url: str, db_url: str, cache_s: float, **more: Any) -> Settings:
    return Settings.load(
        {}, redis_url=redis_url, redis_prefix="bench-path:", api_key=KEY, secret=SECRET,
        db_url=db_url, ws_port=0, grpc_port=0, gateway_cache_s=cache_s, **more,
    )  # fmt: skip


@asynccontextmanager
async def stack(
    redis_url: str, cache_s: float
) -> AsyncIterator[tuple[httpx.AsyncClient, ClientConnection]]:
    """The push API's client and alice's socket on gateway gw1."""
    with tempfile.TemporaryDirectory(prefix="imroute-bench-") as folder:
        db_url = f"sqlite+aiosqlite:///{folder}/users.db"
        await upgrade(db_url)
        gw_settings = settings(redis_url, db_url, cache_s, gateway_id="gw1", group_id="g1")
        app = create_app(settings(redis_url, db_url, cache_s))
        async with AsyncExitStack() as exits:
            gw = await exits.enter_async_context(Gateway(gw_settings))
            await exits.enter_async_context(app.router.lifespan_context(app))
            http = await exits.enter_async_context(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://push")
            )
            token = issue_token(SECRET, "alice", 3600, SystemClock())
            ws = await exits.enter_async_context(
                connect(f"ws://127.0.0.1:{gw.ws_port}/ws?token={token}")
            )
            while json.loads(await ws.recv())["type"] != "recovered":
                pass  # the replay of a new connection, then its route is in Redis
            yield http, ws


async def push(http: httpx.AsyncClient, ws: ClientConnection, n: int) -> str:
    """One push to alice and its answer; the position of the frame she got."""
    body = {"to": ["alice"], "content": {"n": n}}
    answer = await http.post("/v1/push", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200, answer.text
    frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert frame["type"] == "push" and frame["content"] == {"n": n}, frame
    pos: str = frame["pos"]
    return pos


async def ack(ws: ClientConnection, pos: str) -> None:
    """Alice's ack, and time for the gateway's ack flush (every 50 ms) to write it: the
    ack is the client's next message, not the push's path, and is kept out of the next
    push's watch."""
    await ws.send(json.dumps({"type": "ack", "pos": pos}))
    await asyncio.sleep(0.3)


async def crossed(
    http: httpx.AsyncClient, ws: ClientConnection, n: int
) -> tuple[set[str], set[str]]:
    """The modules one push runs code of: before the socket write, and only after it."""
    before: set[str] = set()
    after: set[str] = set()

    def watch(frame: FrameType, event: str, _: object) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(ROOT):
            return
        module = frame.f_code.co_filename[len(ROOT) :]
        if module.split(os.sep)[0] not in PACKAGES:
            return
        if (module, frame.f_code.co_name) == WRITE and not after:
            before.add(module)
            after.add(module)  # the write is the turn: all that follows is after
            return
        (after if after else before).add(module)

    sys.setprofile(watch)
    try:
        pos = await push(http, ws, n)
    finally:
        sys.setprofile(None)
    await ack(ws, pos)
    return before, after - before


def lines(title: str, modules: set[str]) -> list[str]:
    ours = sorted(m for m in modules if not m.startswith("shared"))
    shared = sorted(m for m in modules if m.startswith("shared"))
    return [
        f"{title}: {len(ours)} modules, {len(shared)} more of shared/",
        *(f"  {m}" for m in ours),
        f"  shared/: {', '.join(m.removeprefix('shared/') for m in shared)}",
    ]


async def run(redis_url: str, cache_s: float) -> None:
    async with stack(redis_url, cache_s) as (http, ws):
        for n in range(2):
            await ack(ws, await push(http, ws, n))
        runs = [await crossed(http, ws, n) for n in range(2, 5)]
    before = set.intersection(*(b for b, _ in runs))
    after = set.intersection(*(b | a for b, a in runs)) - before
    for line in [
        *lines("from the HTTP request to the socket write", before),
        *lines("after the write (the gateway's answer, the receipt, the HTTP answer)", after),
    ]:
        print(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default=os.environ.get("IMROUTE_REDIS_URL"))
    p.add_argument("--cache-s", type=float, default=5.0, help="IMROUTE_GATEWAY_CACHE_S")
    args = p.parse_args()
    url = args.redis_url or "redis://127.0.0.1:6379/0"
    if args.redis_url is None and not redis_answers(url):
        with EmbeddedRedis() as embedded:
            asyncio.run(run(embedded.url, args.cache_s))
        return
    asyncio.run(run(url, args.cache_s))


if __name__ == "__main__":
    main()
