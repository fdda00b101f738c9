"""Delivery receipts (no Redis here): what became of each recipient of a push.

Every push has a receipt, whatever its mode, readable for `IMROUTE_RECEIPTS_TTL_S`:
how many recipients it had, how many were online when it was sent, and how many of
them it was delivered to (written to at least one connection), acked by (at least one
device acked), queued for (not written anywhere yet: offline, or a gateway failed) or
expired for (its ttl_s passed before it was written).

A push with at most `IMROUTE_RECEIPTS_MAX_RECIPIENTS` recipients is *listable*: its
receipt holds each recipient's state, so the counts are exact and `recipients` pages
through the uids in a state. A larger one (a big multicast, any broadcast) holds counts
only: acked and delivered are counted as distinct uids by a HyperLogLog (about 1 % off).

A recipient's state only ever moves up: queued -> expired, queued -> delivered ->
acked (an ack may arrive before the router's record of the delivery: it still counts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from shared.settings import ReceiptSettings

__all__ = [
    "ACKED",
    "DELIVERED",
    "EXPIRED",
    "LISTS",
    "QUEUED",
    "STATES",
    "Counts",
    "NewReceipt",
    "ReceiptLimits",
    "ReceiptLog",
    "ReceiptReads",
    "ReceiptUpdates",
    "RecipientPage",
    "estimated",
    "moves_up",
]

# A recipient's state, as one character in Redis.
QUEUED = "q"
EXPIRED = "x"
DELIVERED = "d"
ACKED = "a"
STATES = (QUEUED, EXPIRED, DELIVERED, ACKED)  # in rank order: a state only moves right
# What `ReceiptReads.page` lists: the states each name covers.
LISTS = {"acked": {ACKED}, "unacked": {QUEUED, EXPIRED, DELIVERED}, "queued": {QUEUED}}


def moves_up(old: str | None, new: str) -> bool:
    """Whether a recipient at `old` (None: none yet) moves to `new`: only to a higher rank
    (expired -> delivered too: a gateway's late answer still counts). The Redis store's
    scripts say the same in `move_fn.lua`."""
    return old is None or STATES.index(new) > STATES.index(old)


def estimated(recipients: int, acked: int, delivered: int) -> tuple[int, int]:
    """A counts-only receipt's (acked, delivered) from its counts of distinct uids: never
    more than its recipients (when known; a broadcast's are its job's), and as many
    delivered as acked at least."""
    cap = recipients or None
    acked = min(acked, cap) if cap else acked
    delivered = max(delivered, acked)
    return acked, min(delivered, cap) if cap else delivered


@dataclass(frozen=True, slots=True)
class ReceiptLimits:
    ttl_s: float = 86_400.0  # IMROUTE_RECEIPTS_TTL_S; 0 turns receipts off
    max_recipients: int = 10_000  # IMROUTE_RECEIPTS_MAX_RECIPIENTS: listable up to this

    @classmethod
    def from_settings(cls, s: ReceiptSettings) -> ReceiptLimits:
        return cls(s.receipts_ttl_s, s.receipts_max_recipients)

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl_s * 1000)


@dataclass(frozen=True, slots=True)
class Counts:
    """A receipt's counts (what `GET /v1/pushes/{push_id}` shows)."""

    mode: str
    recipients: int
    online: int
    delivered: int
    acked: int
    queued: int
    expired: int
    listable: bool


@dataclass(slots=True)  # not frozen: one per message; frozen costs 5x to build
class NewReceipt:
    """The router's record of a push as it was sent: its recipients and their states."""

    push_id: str
    mode: str  # "p2p", "multicast", "broadcast"
    recipients: int
    online: int
    states: Mapping[str, str] = field(default_factory=dict)  # uid -> state (listable only)
    # For the message.unacked webhook: the message's own fields, kept with the receipt.
    meta: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RecipientPage:
    uids: list[str]
    cursor: str | None  # pass it back for the next page; None: that was the last


class ReceiptLog(Protocol):
    """The router's writes."""

    async def record(self, receipt: NewReceipt, listable: bool, due_ms: int = 0) -> None:
        """Write (or merge into) a push's receipt; states never move down. `due_ms`:
        when its message.unacked webhook event is due (0: none)."""
        ...

    async def record_many(self, receipts: Sequence[tuple[NewReceipt, bool, int]]) -> None:
        """`record` for many (receipt, listable, due_ms) in one round trip."""
        ...

    async def add(self, push_id: str, recipients: int, online: int, queued: int) -> None:
        """Add a page's counts to a counts-only receipt (a broadcast, page by page)."""
        ...


class ReceiptUpdates(Protocol):
    """The gateways' writes: recipients that were delivered, acked or expired."""

    async def mark(self, state: str, by_push: Mapping[str, Sequence[str]]) -> None:
        """Move each push's uids to `state` (one round trip for all of them)."""
        ...


class ReceiptReads(Protocol):
    async def counts(self, push_id: str) -> Counts | None:
        """The receipt's counts; None when there is none (unknown, or expired)."""
        ...

    async def states(self, push_id: str, uids: Sequence[str]) -> dict[str, str]:
        """Each uid's state (a listable receipt; uids it does not hold are left out)."""
        ...

    async def page(self, push_id: str, state: str, cursor: str | None, limit: int) -> RecipientPage:
        """Recipients in `state` ("acked", "unacked" or "queued"), in uid order after
        `cursor`. The caller checks first that the receipt is listable."""
        ...

    async def meta(self, push_id: str) -> dict[str, str]:
        """The message fields recorded with the receipt (`NewReceipt.meta`)."""
        ...
