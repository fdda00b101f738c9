"""One live gateway per id: a gateway refuses to start under an id another holds."""

from __future__ import annotations

import asyncio
import logging

from router.fleet.store import RedisGatewayFleet
from shared.clock import Clock
from shared.errors import ConfigError

__all__ = ["claim_id"]

log = logging.getLogger(__name__)


async def claim_id(fleet: RedisGatewayFleet, gateway_id: str, mine: str, clock: Clock) -> None:
    """Refuse to start under an id another live gateway holds: two would overwrite
    each other's fleet record, and pushes for one's users would reach the other.

    A record at our own address is this gateway's previous life (a restart). One at
    another address may be a live gateway or a dead one whose record has not lapsed
    (a crash, then a restart on a new pod IP): a live gateway renews its record every
    heartbeat, so we watch it until it renews (live: refuse, naming it) or lapses."""
    other, left_ms = await fleet.record(gateway_id)
    if other is None or other.grpc_address == mine:
        return
    log.warning(
        "gateway id %s is announced at %s: waiting up to %.1fs to see if it is alive",
        gateway_id,
        other.grpc_address,
        left_ms / 1000,
    )
    deadline = clock.monotonic() + left_ms / 1000 + 0.5
    while clock.monotonic() < deadline:
        await asyncio.sleep(0.1)
        again, now_left = await fleet.record(gateway_id)
        if again is None or again.grpc_address == mine:
            return  # it lapsed or withdrew: the id is free
        if now_left > left_ms or again.started_ms != other.started_ms:
            raise ConfigError(
                f"IMROUTE_GATEWAY_ID: {gateway_id} is already live at "
                f"{again.grpc_address} (started at {again.started_ms} ms since the epoch, "
                f"heartbeating): give this gateway another id, or stop that one"
            )
        left_ms = now_left
    # Past its whole TTL without a renewal: the record is a dead gateway's.
