"""The fleet's seams: where gateways announce themselves and the live ones are found, and
how a gateway is asked to drain."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from shared.models import GatewayInfo

__all__ = ["DrainRequests", "GatewayFleet"]


class GatewayFleet(Protocol):
    """Where gateways announce themselves and where the router finds the live ones."""

    async def announce(self, info: GatewayInfo) -> bool: ...
    async def withdraw(self, gateway_id: str) -> None: ...
    async def live(self) -> list[GatewayInfo]: ...


class DrainRequests(Protocol):
    """Asking a gateway to drain, and a gateway asking whether it was asked."""

    async def request(self, gateway_id: str, boot_ms: int) -> None:
        """Ask the gateway that started at `boot_ms` (its fleet record says) to drain."""
        ...

    async def request_unless_last(
        self, gateway_id: str, boot_ms: int, others: Mapping[str, int]
    ) -> bool:
        """Ask as `request` does, unless each of `others` (gateway id -> boot, the rest of
        its group that is not draining) is already asked to drain; False, and nothing
        asked, then. Atomic: two such requests cannot both take a group's last two."""
        ...

    async def take(self, gateway_id: str, boot_ms: int) -> bool:
        """Whether this boot of the gateway was asked to drain, once: the request is
        marked taken, and still counts for `request_unless_last` until it lapses (the
        gateway's record says draining by then); one for another boot is dropped, so a
        restarted gateway never drains again."""
        ...
