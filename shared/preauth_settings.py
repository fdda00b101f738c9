"""What a gateway's WebSocket port allows a socket before its 101, per address and in
time, a mixin of `shared.settings.Settings` (read as `IMROUTE_*` like any other field).
docs/security.md, "Sockets before a 101"; README, "Connecting: the handshake"."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

__all__ = ["PreAuthSettings"]


class PreAuthSettings(BaseSettings):
    # gateway: sockets without their 101 one client address (an IPv4 address, an IPv6
    # /64) may hold, of IMROUTE_WS_MAX_PRE_AUTH; more from it are closed at once. A
    # handshake takes a round trip or two, so this many at once is an office's clients
    # behind one NAT address all reconnecting in the same instant, or a load test's
    # handshakes in flight; a quarter of the pool, which the eviction of the biggest
    # holder's oldest keeps fair when it is full (docs/security.md)
    ws_max_pre_auth_per_ip: int = Field(256, ge=1, le=1_000_000)
    # gateway: a socket that has not sent its request line this long after its accept is
    # cut (a silent socket); one that has gets the rest of IMROUTE_WS_HANDSHAKE_TIMEOUT_S
    ws_request_line_timeout_s: float = Field(1.0, gt=0, le=60)
