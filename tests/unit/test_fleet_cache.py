"""CachedFleet: expiry by the injected clock, and single-flight refreshes."""

from __future__ import annotations

import asyncio

from router.fleet import CachedFleet
from shared.clock import ManualClock
from shared.models import GatewayInfo


class CountingFleet:
    def __init__(self) -> None:
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def announce(self, info: GatewayInfo) -> None:
        raise NotImplementedError

    async def withdraw(self, gateway_id: str) -> None:
        raise NotImplementedError

    async def live(self) -> list[GatewayInfo]:
        self.reads += 1
        await self.gate.wait()
        return [GatewayInfo(f"gw{self.reads}", "g1", "ws://x", "x:1", 0, 0)]


async def test_cached_until_max_age_then_reread() -> None:
    fleet, clock = CountingFleet(), ManualClock()
    cache = CachedFleet(fleet, clock, max_age_s=1.0)
    assert (await cache.live())[0].gateway_id == "gw1"
    clock.advance(0.9)
    assert (await cache.live())[0].gateway_id == "gw1"
    clock.advance(0.2)
    assert (await cache.live())[0].gateway_id == "gw2"
    cache.invalidate()
    assert (await cache.live())[0].gateway_id == "gw3"


async def test_concurrent_callers_share_one_read() -> None:
    fleet, clock = CountingFleet(), ManualClock()
    cache = CachedFleet(fleet, clock, max_age_s=1.0)
    fleet.gate.clear()
    waiters = [asyncio.create_task(cache.live()) for _ in range(50)]
    await asyncio.sleep(0)
    waiters[0].cancel()  # one caller giving up does not cancel the shared read
    fleet.gate.set()
    results = await asyncio.gather(*waiters[1:])
    assert fleet.reads == 1
    assert {r[0].gateway_id for r in results} == {"gw1"}
