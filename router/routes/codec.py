"""A route's value in its user's hash: ``"gateway_id|group_id|ip|port|expires_ms"``.

Written by the gateway, read by every look-up (the key names are in `shared.keys`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.models import Route

__all__ = ["decode_route", "encode_route", "group_live_routes"]


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
