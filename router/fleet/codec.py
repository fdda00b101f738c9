"""A gateway's fleet record: the JSON under ``gw:{id}`` (the key names are in `shared.keys`)."""

from __future__ import annotations

import json

from shared.models import GatewayInfo

__all__ = ["decode_gateway", "encode_gateway"]


def encode_gateway(info: GatewayInfo, heartbeat_ms: int = 0) -> str:
    """`heartbeat_ms`: when this record is written (the announcing heartbeat)."""
    return json.dumps(
        {
            "gateway_id": info.gateway_id,
            "group_id": info.group_id,
            "ws_url": info.ws_url,
            "grpc_address": info.grpc_address,
            "connections": info.connections,
            "started_ms": info.started_ms,
            "max_connections": info.max_connections,
            "zone": info.zone,
            "draining": info.draining,
            "heartbeat_ms": heartbeat_ms or info.heartbeat_ms,
            "bus": info.bus,
        },
        separators=(",", ":"),
    )


def decode_gateway(value: str) -> GatewayInfo | None:
    try:
        d = json.loads(value)
        return GatewayInfo(
            gateway_id=str(d["gateway_id"]),
            group_id=str(d["group_id"]),
            ws_url=str(d["ws_url"]),
            grpc_address=str(d["grpc_address"]),
            connections=int(d["connections"]),
            started_ms=int(d["started_ms"]),
            max_connections=int(d["max_connections"]),
            zone=None if d["zone"] is None else str(d["zone"]),
            draining=bool(d["draining"]),
            heartbeat_ms=int(d["heartbeat_ms"]),
            bus=str(d.get("bus") or ""),  # not in a record of the version before
        )
    except (ValueError, KeyError, TypeError):
        return None
