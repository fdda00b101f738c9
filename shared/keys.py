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
from collections.abc import Iterable, Sequence
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
    "group_live_routes",
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

    def drain(self, gateway_id: str) -> str:
        """Set (with a TTL) to ask a gateway to drain; it checks at every heartbeat."""
        return f"{self.prefix}drain:{gateway_id}"

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


def group_live_routes(
    uids: Iterable[str], values: Iterable[Sequence[str]], now_ms: int
) -> tuple[int, dict[str, list[str]]]:
    """Group each uid by the group ids of its live route values (`values[i]` is uid i's).

    Returns how many uids have a live route, and the uids of each group in input order;
    a uid with several live routes in one group is listed once for it. The multicast
    look-up's decoder, the hot loop of a 1M-recipient push: no `Route` objects, and each
    distinct "gateway|group|ip|port" part is parsed once per call, so a route costs one
    `rpartition` and one `int`. Values this version cannot read count as no route, as in
    `decode_route`.
    """
    by_group: dict[str, list[str]] = {}
    # "gateway|group|ip|port" -> its group's list in by_group, or None when unreadable.
    members_of: dict[str, list[str] | None] = {}
    online = 0
    for uid, routes in zip(uids, values, strict=True):
        if len(routes) == 1:  # most users: one device
            head, _, deadline = routes[0].rpartition("|")
            try:
                if int(deadline) <= now_ms:
                    continue
            except ValueError:
                continue
            members = members_of.get(head)
            if members is None:
                if head in members_of:
                    continue
                group = _group_of_head(head)
                members = members_of[head] = (
                    None if group is None else by_group.setdefault(group, [])
                )
                if members is None:
                    continue
            members.append(uid)
            online += 1
        elif routes:
            groups = {g for value in routes if (g := _live_group(value, now_ms)) is not None}
            if groups:
                online += 1
                for group in sorted(groups):
                    by_group.setdefault(group, []).append(uid)
    return online, by_group


def _group_of_head(head: str) -> str | None:
    """The group id of a route value's "gateway|group|ip|port" part, if readable."""
    parts = head.split("|")
    if len(parts) != 4:
        return None
    try:
        int(parts[3])
    except ValueError:
        return None
    return parts[1]


def _live_group(value: str, now_ms: int) -> str | None:
    head, _, deadline = value.rpartition("|")
    try:
        if int(deadline) <= now_ms:
            return None
    except ValueError:
        return None
    return _group_of_head(head)


def encode_gateway(info: GatewayInfo) -> str:
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
            # Records of older gateways lack these: no limit, no zone, not draining.
            max_connections=int(d.get("max_connections", 0)),
            zone=None if d.get("zone") is None else str(d["zone"]),
            draining=bool(d.get("draining", False)),
        )
    except (ValueError, KeyError, TypeError):
        return None
