"""Who may open a socket, sans I/O: the limits before the 101, the per-IP connect rate,
and the counted, rate-limited report of every refusal. (The sockets without a 101 are
counted per address by `socket_gateway.preauth.PreAuthPool`.)

Time is passed in (monotonic seconds), so all of it is tested without sleeping.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.http_heads import HeadLimits
from shared.throttled import ThrottledLine

if TYPE_CHECKING:
    from shared.settings import GatewaySettings

__all__ = [
    "MAX_TRACKED_IPS",
    "REFUSALS",
    "REFUSAL_LOG_EVERY_S",
    "ConnectRate",
    "HandshakeLimits",
    "Refusals",
    "request_line_ok",
]

# Per-IP buckets kept at most (least recently seen dropped first): about 150 bytes each.
MAX_TRACKED_IPS = 65_536
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
    "bad_request": (
        "Sockets answered 400 (or, not HTTP at all, closed): a first line that is no "
        "request line (GET <target> HTTP/1.x), or a head that is no HTTP request",
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
        "Sockets over IMROUTE_WS_CONNECT_RATE_PER_IP: answered 429, or closed at once "
        "when every place before a 101 is taken (one over the rate takes no other's)",
        logging.WARNING,
    ),
    "unauthorized": ("Handshakes answered 401: missing, bad or expired token", logging.INFO),
    "full": ("Handshakes answered 503: at IMROUTE_GATEWAY_MAX_CONNECTIONS", logging.WARNING),
    "not_accepting": ("Handshakes answered 503: draining or shutting down", logging.INFO),
}


# A handshake's request line: GET, a target of printable ASCII, HTTP/1.x, CRLF.
_REQUEST_LINE = re.compile(rb"GET [!-~]+ HTTP/1\.[0-9]\r\n")


def request_line_ok(line: bytes | bytearray) -> bool:
    """Whether `line` (up to and including its LF) is shaped like a WebSocket handshake's
    request line: only then does the socket get the rest of the head's deadline."""
    return _REQUEST_LINE.fullmatch(line) is not None


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
    def from_settings(cls, settings: GatewaySettings) -> HandshakeLimits:
        return cls(
            max_pre_auth=settings.ws_max_pre_auth,
            connect_rate_per_ip=settings.ws_connect_rate_per_ip,
            connect_burst_per_ip=settings.ws_connect_burst_per_ip,
            max_pre_auth_per_ip=settings.ws_max_pre_auth_per_ip,
            request_line_s=settings.ws_request_line_timeout_s,
            head=HeadLimits.from_settings(settings),
        )


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
    most once per `every_s`, with how many there were since the previous line
    (`ThrottledLine`)."""

    def __init__(
        self,
        log: logging.Logger,
        every_s: float = REFUSAL_LOG_EVERY_S,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lines = {
            kind: ThrottledLine(
                log,
                "refused %(n)d socket(s): %(kind)s%(detail)s",
                level=level,
                every_s=every_s,
                now=now,
            )
            for kind, (_, level) in REFUSALS.items()
        }

    @property
    def counts(self) -> dict[str, int]:
        """Refusals so far, by kind."""
        return {kind: line.total for kind, line in self._lines.items()}

    def note(self, kind: str, detail: str = "") -> None:
        """One refusal of `kind` (a key of REFUSALS); `detail` goes into the log line."""
        self._lines[kind].note(kind=kind, detail=f" ({detail})" if detail else "")

    def metrics(self) -> dict[str, tuple[str, float]]:
        """name -> (help, value), for the gateway's metrics."""
        return {
            f"handshakes_refused_{kind}": (text, self._lines[kind].total)
            for kind, (text, _) in REFUSALS.items()
        }
