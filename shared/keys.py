"""The Redis key schema: the one place that says how routes and the fleet are stored.

The gateway writes these keys and the router reads them, so both go through here.

- ``{prefix}route:{uid}`` is a hash, one field per live connection of the user:
  ``conn_id -> "gateway_id|group_id|ip|port|expires_ms"``. Each field carries its own
  deadline (Redis 7.0 has no per-field TTL) and the key itself has a PEXPIRE that
  every register and heartbeat pushes forward, so a crashed gateway's routes stop
  counting at their deadline and vanish from Redis within one route TTL.
- ``{prefix}gw:{gateway_id}`` is the gateway's JSON record, with a PEXPIRE.
- ``{prefix}gateways`` is a sorted set, ``gateway_id`` scored by its record's deadline.
- ``{prefix}bus:{topic}`` is the Redis Streams bus's stream of one topic.
- ``{prefix}job:{push_id}`` is a broadcast or multicast job's status hash; it expires a
  week after the job finished.
- ``{prefix}jobs:running`` is a sorted set of running jobs' push ids scored by the end of
  their lease; a job whose lease lapsed was orphaned by a dead push service.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from shared.errors import InvalidInput
from shared.models import GatewayInfo, Route

__all__ = [
    "ID_PATTERN",
    "KeySchema",
    "decode_gateway",
    "decode_route",
    "encode_gateway",
    "encode_route",
    "validate_id",
]

# Gateway and group ids appear inside route values and key names.
ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def validate_id(field: str, value: str) -> str:
    """Return `value` if it is a valid gateway or group id, else raise InvalidInput."""
    if not ID_PATTERN.fullmatch(value):
        raise InvalidInput(field, "must be 1-64 characters of letters, digits, '_', '.' or '-'")
    return value


@dataclass(frozen=True, slots=True)
class KeySchema:
    """Key names under one prefix, so several stacks (or test runs) can share a Redis."""

    prefix: str = "imroute:"

    def route(self, uid: str) -> str:
        return f"{self.prefix}route:{uid}"

    def gateway(self, gateway_id: str) -> str:
        return f"{self.prefix}gw:{gateway_id}"

    def gateways(self) -> str:
        return f"{self.prefix}gateways"

    def bus_stream(self, topic: str) -> str:
        return f"{self.prefix}bus:{topic}"

    def job(self, push_id: str) -> str:
        return f"{self.prefix}job:{push_id}"

    def jobs_running(self) -> str:
        return f"{self.prefix}jobs:running"


def encode_route(gateway_id: str, group_id: str, ip: str, port: int, expires_ms: int) -> str:
    """The hash value of one connection's route."""
    return f"{gateway_id}|{group_id}|{ip}|{port}|{expires_ms}"


def decode_route(uid: str, conn_id: str, value: str) -> Route | None:
    """Parse a route value; None for a value this version cannot read."""
    parts = value.split("|")
    if len(parts) != 5:
        return None
    gateway_id, group_id, ip, port, expires_ms = parts
    try:
        return Route(uid, conn_id, gateway_id, group_id, ip, int(port), int(expires_ms))
    except ValueError:
        return None


def encode_gateway(info: GatewayInfo) -> str:
    return json.dumps(
        {
            "gateway_id": info.gateway_id,
            "group_id": info.group_id,
            "ws_url": info.ws_url,
            "grpc_address": info.grpc_address,
            "connections": info.connections,
            "started_ms": info.started_ms,
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
        )
    except (ValueError, KeyError, TypeError):
        return None
