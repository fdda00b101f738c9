"""Sockets accepted and not authenticated yet, counted per client address from their
accept, sans I/O: `PreAuthPool`, and `client_key`, the address a socket is counted (and
rate-limited) under. Used by the WebSocket port before a 101 (socket_gateway.ws) and by
the delivery link before its hello (socket_gateway.link_server).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["PER_KEY_CAP", "TOTAL_CAP", "PreAuthPool", "client_key"]

_DOTTED_QUAD = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}")


def client_key(peer: object) -> str | None:
    """The rate-limit key of a peer address: the IPv4 address, or the IPv6 /64 (one
    host usually holds a whole /64); None when it is not an IP socket."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return None
    if _DOTTED_QUAD.fullmatch(peer[0]):  # an AF_INET peer, as the kernel writes it
        return peer[0]  # (taken on every accept: a tenth of what parsing costs)
    try:
        ip = ipaddress.ip_address(peer[0].split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


T = TypeVar("T", bound=Hashable)

# What PreAuthPool.refusal answers: the key is at its own cap, or the pool is full and
# the key holds the most (so it would only take a place from itself).
PER_KEY_CAP = "pre_auth_per_ip"
TOTAL_CAP = "pre_auth_cap"


class PreAuthPool(Generic[T]):
    """Sockets accepted and not authenticated yet, each under its client key, counted
    from their accept: at most `max_total` in all and `max_per_key` under one key.

    When all `max_total` places are taken, a newcomer whose key holds fewer than the
    biggest holder takes the place of that holder's oldest socket, so one address (or a
    few) holding every place cannot lock the others out; a newcomer from the biggest
    holder itself is refused. Every operation is O(1): the keys are also kept by how
    many they hold, so the biggest holder is known without a scan.
    """

    __slots__ = ("_at", "_by_key", "_key_of", "_top", "max_per_key", "max_total")

    def __init__(self, max_total: int, max_per_key: int) -> None:
        if max_total < 1 or max_per_key < 1:
            raise ValueError("max_total and max_per_key must be at least 1")
        self.max_total = max_total
        self.max_per_key = max_per_key
        self._key_of: dict[T, str] = {}
        self._by_key: dict[str, dict[T, None]] = {}  # key -> its items, oldest first
        # n -> the keys holding n items, in the order they came to hold n
        self._at: dict[int, dict[str, None]] = {}
        self._top = 0  # what the biggest holder holds

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, item: object) -> bool:
        return item in self._key_of

    @property
    def full(self) -> bool:
        """Every place is taken: a newcomer would take someone's place, if any."""
        return len(self._key_of) >= self.max_total

    def held(self, key: str) -> int:
        """Items under `key`."""
        items = self._by_key.get(key)
        return 0 if items is None else len(items)

    def refusal(self, key: str) -> str | None:
        """PER_KEY_CAP or TOTAL_CAP when a newcomer under `key` may not be added, else
        None (`add` then takes it, making room if it must)."""
        n = self.held(key)
        if n >= self.max_per_key:
            return PER_KEY_CAP
        if len(self._key_of) >= self.max_total and n >= self._top:
            return TOTAL_CAP
        return None

    def add(self, item: T, key: str) -> tuple[T, str] | None:
        """Add `item` (which `refusal(key)` allowed); the item it displaced and that
        item's key when the pool was full (the caller closes it), else None."""
        evicted = None
        if len(self._key_of) >= self.max_total:
            victim_key = next(iter(self._at[self._top]))
            victim = next(iter(self._by_key[victim_key]))
            self.discard(victim)
            evicted = (victim, victim_key)
        items = self._by_key.setdefault(key, {})
        self._move(key, len(items), len(items) + 1)
        items[item] = None
        self._key_of[item] = key
        return evicted

    def discard(self, item: T) -> None:
        """Remove `item` if it is in (authenticated, or gone)."""
        key = self._key_of.pop(item, None)
        if key is None:
            return
        items = self._by_key[key]
        del items[item]
        self._move(key, len(items) + 1, len(items))
        if not items:
            del self._by_key[key]

    def _move(self, key: str, held: int, now_held: int) -> None:
        at = self._at
        if held:
            keys = at[held]
            del keys[key]
            if not keys:
                del at[held]
                if self._top == held:
                    self._top = now_held  # counts change by one: now_held is held by `key`
        if now_held:
            at.setdefault(now_held, {})[key] = None
            self._top = max(self._top, now_held)
