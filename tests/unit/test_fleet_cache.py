"""CachedFleet: expiry by the injected clock, and single-flight refreshes."""

from __future__ import annotations

import asyncio

from router.fleet.cache import CachedFleet
from router.testing import ManualClock
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


class ScriptedFleet(CountingFleet):
    """Answers each read with the next scripted membership."""

    def __init__(self, *rounds: dict[str, str]) -> None:
        super().__init__()
        self.rounds = list(rounds)

    async def live(self) -> list[GatewayInfo]:
        members = self.rounds.pop(0)
        return [GatewayInfo(g, "g1", "ws://x", a, 0, 0) for g, a in members.items()]


async def test_on_change_hears_every_read_but_not_cached_answers() -> None:
    fleet = ScriptedFleet({"gw1": "a:1", "gw2": "b:1"}, {"gw1": "a:1"}, {"gw1": "a:2"})
    heard: list[dict[str, str]] = []
    clock = ManualClock()
    cache = CachedFleet(
        fleet,
        clock,
        max_age_s=1,
        on_change=lambda fresh: heard.append({g.gateway_id: g.grpc_address for g in fresh}),
    )
    await cache.live()
    await cache.live()  # from the cache: nothing new to hear
    for _ in range(2):
        clock.advance(1)
        await cache.live()
    assert heard == [{"gw1": "a:1", "gw2": "b:1"}, {"gw1": "a:1"}, {"gw1": "a:2"}]


async def test_a_raising_change_listener_does_not_fail_the_read() -> None:
    def broken(members: object) -> None:
        raise RuntimeError("bug")

    cache = CachedFleet(ScriptedFleet({"gw1": "a:1"}), ManualClock(), 0, on_change=broken)
    assert [g.gateway_id for g in await cache.live()] == ["gw1"]
