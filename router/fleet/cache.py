"""The fleet as the hot paths read it: a short-lived, single-flight local copy."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from router.fleet.base import GatewayFleet
from shared.clock import Clock
from shared.models import GatewayInfo

__all__ = ["CachedFleet"]

log = logging.getLogger(__name__)


class CachedFleet:
    """A short-lived local cache in front of a fleet, so hot paths do not ask Redis each time.

    Refreshes are single-flight: when the cache expires under load, one read goes to
    Redis and every caller waiting meanwhile shares its answer. `on_change` hears the
    live gateways after each read from Redis.
    """

    def __init__(
        self,
        fleet: GatewayFleet,
        clock: Clock,
        max_age_s: float,
        on_change: Callable[[Sequence[GatewayInfo]], None] | None = None,
        on_started: Callable[[str, str], None] | None = None,
    ) -> None:
        """`on_started(gateway_id, grpc_address)`: a known gateway now announces another
        start time."""
        self._fleet = fleet
        self._clock = clock
        self._max_age = max_age_s
        self._on_change = on_change
        self._on_started = on_started
        self._started: dict[str, int] = {}
        self._cached: list[GatewayInfo] | None = None
        self.reads = 0  # reads from the fleet behind the cache
        self._at = 0.0
        self._refresh: asyncio.Future[list[GatewayInfo]] | None = None

    async def live(self) -> list[GatewayInfo]:
        if self._cached is not None and self._clock.monotonic() - self._at < self._max_age:
            return self._cached
        if self._refresh is None:
            self._refresh = asyncio.ensure_future(self._read())
        # shield: one caller giving up must not cancel the read the others share.
        return await asyncio.shield(self._refresh)

    async def _read(self) -> list[GatewayInfo]:
        try:
            started = self._clock.monotonic()
            self.reads += 1
            fresh = await self._fleet.live()
            self._cached, self._at = fresh, started
            self._notify(fresh)
            return fresh
        finally:
            self._refresh = None

    def _notify(self, fresh: list[GatewayInfo]) -> None:
        if self._on_started is not None:
            started = {g.gateway_id: g.started_ms for g in fresh}
            for g in fresh:
                if self._started.get(g.gateway_id, g.started_ms) != g.started_ms:
                    try:
                        self._on_started(g.gateway_id, g.grpc_address)
                    except Exception:  # a listener's bug must not fail the read
                        log.exception("fleet restart listener failed")
            self._started = started
        if self._on_change is None:
            return
        try:
            # On every read, not only on a change: what was kept for a departed gateway
            # may be re-created by a call planned before it left, or be kept on purpose
            # for a while (an open circuit), and must still go.
            self._on_change(fresh)
        except Exception:  # a listener's bug must not fail the read
            log.exception("fleet change listener failed")

    def age(self) -> float:
        """Seconds since the cached copy was read (infinite when there is none)."""
        if self._cached is None:
            return float("inf")
        return self._clock.monotonic() - self._at

    def invalidate(self) -> None:
        self._cached = None
