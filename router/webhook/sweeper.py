"""The offline sweeper: turns due presence entries into user.offline events.

One runs in every push service; they share the work safely, because a claim leases its
entries in one script (another sweeper skips them, and takes them over if this one
dies before it settles them) and a settle re-checks the epoch in the script that sends.
A pass that fails (Redis down) is logged and the next one tries again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from router.webhook.presence import RedisPresence, Settled
from shared.clock import Clock
from shared.models import GatewayInfo, Route
from shared.periodic import Periodic

__all__ = ["LiveFleet", "OfflineSweeper", "RouteLookup"]

log = logging.getLogger(__name__)

CLAIM_LIMIT = 1000
LEASE_MS = 30_000  # a claimed entry is due again this long after, unless settled


class RouteLookup(Protocol):
    async def lookup(self, uids: Sequence[str]) -> dict[str, list[Route]]: ...


class LiveFleet(Protocol):
    async def live(self) -> list[GatewayInfo]: ...


@dataclass(slots=True, eq=False)
class OfflineSweeper:
    """Claims due entries every `every_s`, looks their users' routes up, settles them;
    every `adopt_every_s`, adopts the users of gateways out of the fleet two looks running
    (so a gateway still starting, not yet announced, is not taken for gone)."""

    presence: RedisPresence
    routes: RouteLookup
    fleet: LiveFleet
    clock: Clock
    every_s: float
    adopt_every_s: float
    _suspects: set[str] = field(default_factory=set, init=False, repr=False)
    # Monotonic: when the next pass looks for gone gateways.
    _next_adopt: float = field(default=0.0, init=False, repr=False)
    sent: int = field(default=0, init=False)  # user.offline events this sweeper sent
    adopted: int = field(default=0, init=False)  # users of gone gateways it scheduled

    async def sweep(self) -> Settled:
        """One pass over the due entries (up to CLAIM_LIMIT at a time)."""
        total = Settled(0, 0, 0, 0)
        while True:
            claimed = await self.presence.claim(LEASE_MS, CLAIM_LIMIT)
            if not claimed:
                return total
            found = await self.routes.lookup(sorted({uid for _, uid in claimed}))
            entries = [
                (member, uid, max((r.expires_ms for r in found.get(uid, ())), default=0))
                for member, uid in claimed
            ]
            done = await self.presence.settle(entries)
            self.sent += done.offline
            total += done
            if len(claimed) < CLAIM_LIMIT:
                return total

    async def adopt_gone(self) -> int:
        """Schedule the users of gateways not in the fleet now nor at the previous look."""
        holders = await self.presence.gateways()
        live = {g.gateway_id for g in await self.fleet.live()}
        gone = holders - live
        adopted = 0
        for gateway_id in gone & self._suspects:
            n = await self.presence.adopt(gateway_id)
            log.info("webhook presence: gateway %s is gone; %d users scheduled", gateway_id, n)
            adopted += n
        self._suspects = gone
        self.adopted += adopted
        return adopted

    async def _pass(self) -> None:
        """A sweep, after a look for gone gateways when one is due."""
        if self.clock.monotonic() >= self._next_adopt:
            self._next_adopt = self.clock.monotonic() + self.adopt_every_s
            await self.adopt_gone()
        await self.sweep()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """A pass every `every_s` while the block runs, the first at once."""
        self._next_adopt = self.clock.monotonic()
        async with Periodic("webhook offline sweeper", self._pass, self.every_s, log=log):
            yield
