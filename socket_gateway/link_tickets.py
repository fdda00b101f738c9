"""Who may open a delivery link (socket_gateway.link_server): single-use tickets, issued
by the gRPC `Link` method (past the token check and mTLS) and redeemed by a link's
hello, good once for TICKET_S."""

from __future__ import annotations

import hashlib
import secrets

from shared.clock import Clock

__all__ = ["MAX_TICKETS", "TICKET_S", "Tickets"]

TICKET_S = 10.0
MAX_TICKETS = 1024  # tickets issued and not yet used; past it the oldest go


class Tickets:
    """Single-use tickets; kept as their digests, so a look-up's timing says nothing of
    a ticket's bytes."""

    def __init__(self, clock: Clock, ttl_s: float = TICKET_S) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._live: dict[bytes, float] = {}  # digest -> expiry (monotonic), oldest first

    def issue(self) -> bytes:
        now = self._clock.monotonic()
        live = self._live
        for digest, expiry in list(live.items()):
            if expiry > now and len(live) < MAX_TICKETS:
                break
            del live[digest]
        ticket = secrets.token_bytes(32)
        live[hashlib.sha256(ticket).digest()] = now + self._ttl_s
        return ticket

    def redeem(self, ticket: bytes) -> bool:
        expiry = self._live.pop(hashlib.sha256(ticket).digest(), None)
        return expiry is not None and expiry > self._clock.monotonic()
