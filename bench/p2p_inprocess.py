"""CPU per P2P push in one process: push_service's Pushes -> router.p2p -> the coalescer,
over in-memory doubles below the gateway client seam (no Redis, no network, no HTTP).

    .venv/bin/python -m bench.p2p_inprocess [N] [--parse]

The push service's own share of a push, apart from the round trips: compare two commits
by running each checkout's copy. --parse also times POST /v1/push's quick body check."""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Sequence

from push_service.schemas import PushIn
from push_service.services.pushes import Pushes
from router.p2p.pusher import P2PPusher
from router.testing import FakeGatewayClient
from router.testing.routes import OneRoute, OneRouteFleet
from shared.clock import SystemClock
from shared.models import Message


class Log:
    async def append_queued_many(
        self, items: Sequence[tuple[Message, Sequence[str], int]]
    ) -> list[tuple[list[int], int]]:
        return [([7 for _ in uids], 0) for _, uids, _ in items]


async def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20000
    from router.gateway_rpc.client import CoalescingGatewayClient

    # The push service's top of stack (per loop turn) over the in-memory client.
    clients = CoalescingGatewayClient(FakeGatewayClient(), per_turn=True)
    pusher = P2PPusher(OneRoute(), OneRouteFleet(), clients, 1.0, Log())  # type: ignore[arg-type]
    pushes = Pushes(pusher, SystemClock())
    body = PushIn.model_validate({"to": ["amy"], "content": {"text": "hi"}})
    one = functools.partial(pushes.push_one, seed=None)
    for _ in range(2000):
        await one(body)
    best = None
    for _ in range(5):
        t = time.process_time()
        for _ in range(n):
            await one(body)
        per = (time.process_time() - t) / n * 1e6
        best = per if best is None else min(best, per)
    print(f"Pushes.push, 1 online recipient, stored: {best:.2f} us CPU per push (best of 5 x {n})")
    from router.p2p.plan import Outgoing

    message = Message("m1", "p1", 0, "admin", b'"hi"', 0)

    async def p2p() -> object:
        return await pusher.push([Outgoing(message, ["amy"])])

    best = None
    for _ in range(5):
        t = time.process_time()
        for _ in range(n):
            await p2p()
        per = (time.process_time() - t) / n * 1e6
        best = per if best is None else min(best, per)
    print(f"P2PPusher.push alone: {best:.2f} us CPU per push")
    if "--parse" in sys.argv:
        import orjson

        from push_service.fast_push import quick_push

        raw = orjson.loads(b'{"to":["amy"],"content":{"text":"hi"},"msg_type":3,"ttl_s":60}')
        best = None
        for _ in range(5):
            t = time.process_time()
            for _ in range(n * 5):
                quick_push(raw)
            per = (time.process_time() - t) / (n * 5) * 1e6
            best = per if best is None else min(best, per)
        print(f"quick_push: {best:.3f} us CPU per body")


if __name__ == "__main__":
    asyncio.run(main())
