"""A gateway that announces a new start probes its open circuit at once."""

from __future__ import annotations

from router.balancing.stats import BreakerState, StatsRegistry, StatsSettings
from router.fleet.cache import CachedFleet
from shared.clock import ManualClock
from shared.models import GatewayInfo


class Fleet:
    def __init__(self) -> None:
        self.started = 1

    async def live(self) -> list[GatewayInfo]:
        return [GatewayInfo("gw1", "g1", "ws://x/ws", "a:1", 0, self.started)]


async def test_an_open_circuit_probes_once_its_gateway_restarted() -> None:
    clock = ManualClock()
    stats = StatsRegistry(clock, StatsSettings(failure_threshold=1, cool_off_s=10))
    ticket = stats.on_start("gw1")
    assert ticket is not None
    stats.on_failure(ticket)
    assert stats.breaker("gw1").state is BreakerState.OPEN
    fleet = Fleet()
    heard: list[tuple[str, str]] = []

    def restarted(gateway_id: str, address: str) -> None:
        heard.append((gateway_id, address))
        stats.restarted(gateway_id)

    cache = CachedFleet(fleet, clock, 0, on_started=restarted)  # type: ignore[arg-type]
    await cache.live()
    assert stats.breaker("gw1").state is BreakerState.OPEN  # same life: still cooling off
    assert heard == []
    fleet.started = 2
    await cache.live()
    assert heard == [("gw1", "a:1")]
    assert stats.breaker("gw1").state is BreakerState.HALF_OPEN
    assert stats.allow("gw1")
