"""What the balancer knows about one gateway: a frozen snapshot, built from the fleet record."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GatewayState"]


@dataclass(frozen=True, slots=True)
class GatewayState:
    """One gateway as the balancer sees it at one moment (an adapter maps GatewayInfo to it)."""

    gateway_id: str
    group_id: str
    ws_url: str
    grpc_address: str
    connections: int
    max_connections: int
    zone: str | None = None
    draining: bool = False
    heartbeat_deadline_ms: int = 0  # its fleet record's expiry, wall-clock epoch ms

    @property
    def load(self) -> float:
        """Connections as a fraction of capacity (1.0 or more: full)."""
        if self.max_connections <= 0:
            return float("inf")
        return self.connections / self.max_connections
