"""Pure: which gateways hear another kind of bus than this push service publishes on.

A gateway's fleet record says the kind of bus it hears (`GatewayInfo.bus`, from
`router.bus.factory.bus_kind`). One on another kind than the push service's hears none
of its batches: its clients get broadcasts and group pushes only from the topic logs,
late, or not at all. Each such gateway is told once per start of it. Only the kind is
compared: two Redis servers, or two Pub/Sub projects, are not told apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.models import GatewayInfo

__all__ = ["BusAgreement"]


class BusAgreement:
    def __init__(self, own: str) -> None:
        """`own`: this process's bus kind; empty (a bus its caller gave it): no check."""
        self.own = own
        self._told: set[tuple[str, int]] = set()  # (gateway id, its start) told of

    def newly_apart(self, fresh: Sequence[GatewayInfo]) -> list[GatewayInfo]:
        """The live gateways on another kind of bus not yet told of; what was told of
        gateways no longer live is forgotten (a fleet whose ids change with each deploy
        does not grow it)."""
        if not self.own:
            return []
        self._told &= {(g.gateway_id, g.started_ms) for g in fresh}
        apart = [
            g
            for g in fresh
            if g.bus not in ("", self.own) and (g.gateway_id, g.started_ms) not in self._told
        ]
        self._told.update((g.gateway_id, g.started_ms) for g in apart)
        return apart
