"""Domain models shared by the router, the push service and the gateway."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GatewayInfo", "Message", "Registration", "Route"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where one connection of a user lives: the gateway's gRPC address and group."""

    uid: str
    conn_id: str
    gateway_id: str
    group_id: str
    ip: str
    port: int
    expires_ms: int

    @property
    def grpc_address(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class GatewayInfo:
    """A live gateway as it announces itself in the fleet registry."""

    gateway_id: str
    group_id: str
    ws_url: str
    grpc_address: str
    connections: int
    started_ms: int
    max_connections: int = 0  # 0: no limit announced
    zone: str | None = None
    draining: bool = False
    deadline_ms: int = 0  # when its heartbeat lapses; from the fleet index, not the record
    heartbeat_ms: int = 0  # when its record was last written (0: not written yet)
    # The kind of bus it hears batches on (`router.bus.factory.bus_kind`: redis, pubsub,
    # memory); empty where not said (a bus its caller gave it, or an older record).
    bus: str = ""


@dataclass(frozen=True, slots=True)
class Message:
    """One push message; `content_json` is the validated content as UTF-8 JSON."""

    msg_id: str
    push_id: str
    msg_type: int
    sender: str
    content_json: bytes
    ts_ms: int


@dataclass(frozen=True, slots=True)
class Registration:
    """One local connection as the gateway registers it."""

    uid: str
    conn_id: str
