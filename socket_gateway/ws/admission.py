"""Who may open a socket, sans I/O: the limits before the 101, the sockets without it
counted per address from their accept (`PreAuthPool`, also the delivery link's before
its hello), the per-IP connect rate, and the counted, rate-limited report of every
refusal.

Time is passed in (monotonic seconds), so all of it is tested without sleeping.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from shared.http_heads import HeadLimits

if TYPE_CHECKING:
    from shared.settings import Settings

__all__ = [
    "MAX_TRACKED_IPS",
    "PER_KEY_CAP",
    "REFUSALS",
    "REFUSAL_LOG_EVERY_S",
    "TOTAL_CAP",
    "ConnectRate",
    "HandshakeLimits",
    "PreAuthPool",
    "Refusals",
    "client_key",
]

# Per-IP buckets kept at most (least recently seen dropped first): about 150 bytes each.
MAX_TRACKED_IPS = 65_536
_DOTTED_QUAD = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}")
# One log line per kind of refusal per this many seconds, with the count since the last.
REFUSAL_LOG_EVERY_S = 10.0

# kind -> (metric help, log level)
REFUSALS: dict[str, tuple[str, int]] = {
    "pre_auth_cap": (
        "Sockets closed at once: the gateway already held IMROUTE_WS_MAX_PRE_AUTH "
        "sockets without a 101, and their address the most of them",
        logging.WARNING,
    ),
    "pre_auth_per_ip": (
        "Sockets closed at once: their address already held IMROUTE_WS_MAX_PRE_AUTH_PER_IP "
        "sockets without a 101",
        logging.WARNING,
    ),
    "pre_auth_evicted": (
        "Sockets without a 101 closed to make room for one from another address: the "
        "gateway held IMROUTE_WS_MAX_PRE_AUTH of them, and theirs held the most",
        logging.WARNING,
    ),
    "handshake_timeout": (
        "Sockets cut for not sending their request line within "
        "IMROUTE_WS_REQUEST_LINE_TIMEOUT_S, or their whole head within "
        "IMROUTE_WS_HANDSHAKE_TIMEOUT_S",
        logging.INFO,
    ),
    "headers_too_large": (
        "Handshakes answered 431: a request head over IMROUTE_HTTP_MAX_HEAD_BYTES",
        logging.WARNING,
    ),
    "too_many_headers": (
        "Handshakes answered 431: more header fields than IMROUTE_HTTP_MAX_HEADERS",
        logging.WARNING,
    ),
    "uri_too_long": (
        "Handshakes answered 414: a request target over IMROUTE_HTTP_MAX_URL_BYTES",
        logging.WARNING,
    ),
    "rate_limited": (
        "Handshakes answered 429: over IMROUTE_WS_CONNECT_RATE_PER_IP",
        logging.WARNING,
    ),
    "unauthorized": ("Handshakes answered 401: missing, bad or expired token", logging.INFO),
    "full": ("Handshakes answered 503: at IMROUTE_GATEWAY_MAX_CONNECTIONS", logging.WARNING),
    "not_accepting": ("Handshakes answered 503: draining or shutting down", logging.INFO),
}


@dataclass(frozen=True, slots=True)
class HandshakeLimits:
    """What the endpoint allows before a 101 (IMROUTE_WS_*)."""

    max_pre_auth: int = 1000
    connect_rate_per_ip: float | None = None  # None: no per-IP limit
    connect_burst_per_ip: int = 10
    max_pre_auth_per_ip: int = 256  # of max_pre_auth, per client_key
    request_line_s: float = 1.0  # TCP accept -> request line (then the head's deadline)
    # the request head's size (IMROUTE_HTTP_MAX_*)
    head: HeadLimits = field(default_factory=HeadLimits)

    @classmethod
    def from_settings(cls, settings: Settings) -> HandshakeLimits:
        return cls(
            max_pre_auth=settings.ws_max_pre_auth,
            connect_rate_per_ip=settings.ws_connect_rate_per_ip,
            connect_burst_per_ip=settings.ws_connect_burst_per_ip,
            max_pre_auth_per_ip=settings.ws_max_pre_auth_per_ip,
            request_line_s=settings.ws_request_line_timeout_s,
            head=HeadLimits.from_settings(settings),
        )


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


class ConnectRate:
    """A token bucket per client key: `burst` connects at once, then `rate_per_s`.

    Bounded: at most `max_keys` buckets, the least recently used dropped first. A dropped
    bucket comes back full, which only forgives a client nobody had heard from for a while.
    """

    def __init__(self, rate_per_s: float, burst: int, max_keys: int = MAX_TRACKED_IPS) -> None:
        if rate_per_s <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("rate_per_s must be positive, burst and max_keys at least 1")
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, now: float) -> float:
        """Take one connect for `key`: 0.0 if allowed, else the seconds until one is."""
        buckets = self._buckets
        entry = buckets.get(key)
        if entry is None:
            tokens = self.burst
        else:
            tokens, at = entry
            tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate_per_s)
            buckets.move_to_end(key)
        if tokens >= 1.0:
            buckets[key] = (tokens - 1.0, now)
            wait = 0.0
        else:
            buckets[key] = (tokens, now)
            wait = (1.0 - tokens) / self.rate_per_s
        if len(buckets) > self.max_keys:
            buckets.popitem(last=False)
        return wait


class Refusals:
    """Counts of refused sockets by kind (for /metrics), each reported in the log at
    most once per `every_s`, with how many there were since the previous line."""

    def __init__(self, log: logging.Logger, every_s: float = REFUSAL_LOG_EVERY_S) -> None:
        self.counts: Counter[str] = Counter()
        self._log = log
        self._every_s = every_s
        self._unlogged: Counter[str] = Counter()
        self._logged_at: dict[str, float] = {}

    def note(self, kind: str, now: float, detail: str = "") -> None:
        """One refusal of `kind` (a key of REFUSALS); `detail` goes into the log line."""
        self.counts[kind] += 1
        self._unlogged[kind] += 1
        last = self._logged_at.get(kind)
        if last is not None and now - last < self._every_s:
            return
        n = self._unlogged.pop(kind)
        self._logged_at[kind] = now
        since = "" if last is None else f" in the last {math.ceil(now - last)}s"
        self._log.log(
            REFUSALS[kind][1],
            "refused %d socket(s)%s: %s%s",
            n,
            since,
            kind,
            f" ({detail})" if detail else "",
        )

    def metrics(self) -> dict[str, tuple[str, float]]:
        """name -> (help, value), for the gateway's metrics."""
        return {
            f"handshakes_refused_{kind}": (text, self.counts[kind])
            for kind, (text, _) in REFUSALS.items()
        }
