"""CPU per POST /v1/push inside the push service's ASGI app, layer by layer, in process.

    .venv/bin/python -m bench.push_app [--pushes N] [--rounds R]

The app as `create_app` builds it, on the in-memory stores of `router.testing` (no
Redis, no gateway, no sockets, no HTTP parsing): each push is to a user with no route,
so it is logged, queued in the inbox and given a receipt, all in memory (the stored
path to an offline user: a delivered push calls a gateway instead of the inbox). Each request
enters at one layer of the middleware stack, outermost first, so the difference between
two rows is what the layer between them costs (best of R rounds, each on fresh stores,
the layers in another order each round).
Add `bench.http_floor` (the HTTP server with nothing behind it) for the request's cost
apart from its round trips to Redis and the gateways.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

from push_service.app import create_app
from push_service.ratelimit.base import RateLimit, RateLimiter
from push_service.stores import Stores
from push_service.testing import MemoryIdempotencyStore, MemoryRateLimiter
from router import testing as memory
from router.directory.migrate import upgrade
from shared.clock import SystemClock
from shared.settings import PushSettings

API_KEY = "bench-key-0123456789abcdef"
BODY = b'{"to":["4242"],"content":{"ts":1733000000000,"tsend":1733000000000,"seq":12345}}'
HEADERS = [
    (b"host", b"127.0.0.1:8080"),
    (b"authorization", f"Bearer {API_KEY}".encode()),
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
]
SCOPE: dict[str, Any] = {
    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
    "scheme": "http", "path": "/v1/push", "raw_path": b"/v1/push", "query_string": b"",
    "root_path": "", "headers": HEADERS, "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8080),
}  # fmt: skip

Asgi = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def memory_stores(clock: SystemClock) -> Stores:
    recovery = memory.MemoryRecoveryLog()

    def rate_limiter(limit: RateLimit) -> RateLimiter:
        return MemoryRateLimiter(limit, clock)

    async def ping() -> bool:
        return True

    return Stores(
        memory.MemoryRouteRegistry(clock), recovery, memory.MemoryGatewayFleet(),
        memory.MemoryDrainRequests(), memory.MemoryJobStore(clock),
        memory.MemoryReceiptStore(recovery), memory.MemoryStatsStore(),
        idempotency=MemoryIdempotencyStore(), rate_limiter=rate_limiter, ping=ping,
    )  # fmt: skip


async def push(layer: Asgi) -> int:
    """One POST /v1/push entering at `layer`; its status."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await layer(dict(SCOPE), receive, send)
    return int(sent[0]["status"])


async def one_round(db: Path, pushes: int, seed: int) -> dict[str, float]:
    """A fresh app on fresh stores: µs per push entering at each layer, the layers in
    an order of their own (the stores grow as the round goes on)."""
    clock = SystemClock()
    settings = PushSettings.load(
        {}, api_key=API_KEY, secret="bench-secret-0123456789abcdef0123456789",
        db_url=f"sqlite+aiosqlite:///{db}", redis_url="redis://127.0.0.1:1/0",
        log_level="warning",
    )  # fmt: skip
    bus = memory.MemoryBus()
    app = create_app(settings, clock, bus, stores=memory_stores(clock))
    figures: dict[str, float] = {}
    async with bus, app.router.lifespan_context(app):
        assert await push(app) == 200
        layers: list[tuple[str, Asgi]] = [("the app (uvicorn's entry)", app)]
        layer = app.middleware_stack
        while layer is not None and type(layer).__name__ != "ExceptionMiddleware":
            layers.append((type(layer).__name__, layer))
            layer = getattr(layer, "app", None)
        random.Random(seed).shuffle(layers)
        for name, entry in layers:
            start = time.process_time()
            for _ in range(pushes):
                await push(entry)
            figures[name] = (time.process_time() - start) / pushes * 1e6
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="imroute-bench-") as folder:
        db = Path(folder) / "users.db"
        await upgrade(f"sqlite+aiosqlite:///{db}")
        best: dict[str, float] = {}
        for seed in range(args.rounds):
            for name, us in (await one_round(db, args.pushes, seed)).items():
                best[name] = min(best.get(name, us), us)
    print(f"µs per POST /v1/push entering at each layer (best of {args.rounds}, "
          f"{args.pushes} pushes each):")  # fmt: skip
    names = sorted(best, key=best.__getitem__, reverse=True)
    for name, below in zip(names, [*names[1:], None], strict=True):
        own = f"  (this layer: {best[name] - best[below]:+.1f})" if below else ""
        print(f"  {name:32} {best[name]:6.1f}{own}")


if __name__ == "__main__":
    uvloop.run(main())
