"""Delivery receipts (no Redis here): what became of each recipient of a push, a P2P
push's receipt from its outcome (`p2p_receipt`), and what the webhook is told of its
message (`message_meta`).

Every push has a receipt, whatever its mode, readable for `IMROUTE_RECEIPTS_TTL_S`:
how many recipients it had, how many were online when it was sent, and how many of
them it was delivered to (written to at least one connection), acked by (at least one
device acked), queued for (not written anywhere yet: offline, or a gateway failed) or
expired for (never to be written: its ttl_s passed first, or its entry left the inbox
unwritten, below).

A push with at most `IMROUTE_RECEIPTS_MAX_RECIPIENTS` recipients is *listable*: its
receipt holds each recipient's state, so the counts are exact and `recipients` pages
through the uids in a state. A larger one (a big multicast, any broadcast) holds counts
only: acked and delivered are counted as distinct uids by a HyperLogLog (about 1 % off),
and queued is what is left of its recipients (`unwritten`).

A recipient's state only ever moves up: queued -> expired, queued -> delivered ->
acked (an ack may arrive before the router's record of the delivery: it still counts).

**Derived states.** A stored, listable P2P push has a slot-tagged push id
(`shared.keys.slot_tagged`), and its receipt keeps each recipient's position in the
recipient's log beside its state. Its acks are not written to it: a recipient delivered
(or queued: below) is acked once its user's acked position (the one cursor a gateway
moves per user and ack flush, `router.recovery`) has reached that position, read when
the receipt is read (`derive`). Every connection's view of its user's log is contiguous
from where it started, so a device that acked past a position was written it; the inbox moving on
after that (its bound, `IMROUTE_INBOX_MAX`) takes nothing back. (What the cursor cannot
see: an entry written to one device and pushed out of the inbox by the bound, unacked,
reads acked once a device whose view began after it acks past it.) A queued recipient (no
write of it known) whose entry the bound pushed out reads expired; one a connect left
out for its ttl_s is marked expired by that gateway (`Replay.expired_ids`), so the acks
of what came after it do not make it acked. So the gateways write one cursor per user,
not one mark per push (`derives_ack`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from router.p2p.plan import PushOutcome
from shared.errors import InvalidInput
from shared.keys import slot_tagged
from shared.models import Message
from shared.positions import counter_of, epoch_of

if TYPE_CHECKING:
    from shared.settings import ReceiptSettings

__all__ = [
    "ACKED",
    "DELIVERED",
    "EXPIRED",
    "LISTS",
    "PREVIEW_BYTES",
    "QUEUED",
    "STATES",
    "Counts",
    "Cursor",
    "NewReceipt",
    "ReceiptLimits",
    "ReceiptLog",
    "ReceiptReads",
    "ReceiptUpdates",
    "RecipientPage",
    "derivable",
    "derive",
    "derives_ack",
    "estimated",
    "listed",
    "message_meta",
    "moves_up",
    "p2p_receipt",
    "preview_of",
    "recipient_page",
    "split_acked",
    "stored_value",
    "tally",
    "unwritten",
    "with_early",
]

# A recipient's state, as one character in Redis.
QUEUED = "q"
EXPIRED = "x"
DELIVERED = "d"
ACKED = "a"
STATES = (QUEUED, EXPIRED, DELIVERED, ACKED)  # in rank order: a state only moves right
# What `ReceiptReads.page` lists: the states each name covers.
LISTS = {
    "acked": frozenset({ACKED}),
    "unacked": frozenset({QUEUED, EXPIRED, DELIVERED}),
    "queued": frozenset({QUEUED}),
}


def moves_up(old: str | None, new: str) -> bool:
    """Whether a recipient at `old` (None: none yet) moves to `new`: only to a higher rank
    (expired -> delivered too: a gateway's late answer still counts). The Redis store's
    scripts say the same in `move_fn.lua`."""
    return old is None or STATES.index(new) > STATES.index(old)


# A user's cursor as a derived receipt reads it: its log's epoch, the position its
# devices acked up to, and the floor up to which the inbox bound pushed entries out.
Cursor = tuple[int, int, int]


def stored_value(state: str, seq: int) -> str:
    """A derived receipt's value for a recipient: its state, then its position."""
    return f"{state}{seq}"


def derivable(value: str) -> bool:
    """Whether a receipt's value (`stored_value`) may move with its user's cursor: it
    carries a position, and its state is queued (to expired) or delivered (to acked)."""
    return len(value) > 1 and value[0] in (QUEUED, DELIVERED)


def derive(value: str, cursor: Cursor | None) -> str:
    """A recipient's state from its receipt's value (`stored_value`, or a bare state) and
    its user's cursor (None: none read), in the same epoch: delivered reads acked once
    the acked position has reached it (whatever the inbox bound's floor did since: an
    ack stays). Queued (no write of it known) reads expired once the floor passed it
    (the bound pushed it out unwritten), else acked once the acked position reached it:
    a device that acked past it was written it, and the mark saying so was late or lost
    (one a connect skipped for its ttl_s is marked expired by that gateway instead)."""
    state = value[0]
    if cursor is None or not derivable(value):
        return state
    seq = int(value[1:])
    epoch, acked, floor = cursor
    if epoch_of(seq) != epoch:
        return state
    n = counter_of(seq)
    if state == DELIVERED:
        return ACKED if n <= acked else state
    if n <= floor:
        return EXPIRED
    return ACKED if n <= acked else state


def with_early(value: str | None, early: str) -> str:
    """A slot-tagged receipt's value for a recipient (`stored_value`; None: none) with a
    gateway's mark written before the receipt's record (`early`, a bare state), whichever
    ranks higher; the mark takes the value's position (an ack needs none)."""
    if value is None:
        return early
    if not moves_up(value[0], early):
        return value
    return early if early == ACKED else early + value[1:]


def derives_ack(push_id: str, seq: int, furthest: int, inbox_max: int) -> bool:
    """Whether a gateway's ack of `push_id` at `seq` in its user's log needs no mark of
    its own: the push's receipt derives it (`derive`) from the acked position, moved to
    `furthest` in the same flush. Not for an entry `inbox_max` or more behind
    `furthest`, which may have left the inbox (by its bound) before the ack: marked,
    its ack is said outright, whatever its receipt recorded of it."""
    return (
        0 < seq <= furthest
        and epoch_of(seq) == epoch_of(furthest)
        and counter_of(furthest) - counter_of(seq) < inbox_max
        and slot_tagged(push_id)
    )


def tally(states: Iterable[str]) -> dict[str, int]:
    """How many of `states` each state (`STATES`) holds."""
    counts = dict.fromkeys(STATES, 0)
    for state in states:
        counts[state] += 1
    return counts


def unwritten(recipients: int, delivered: int, expired: int) -> int:
    """A counts-only receipt's queued: its recipients not written anywhere yet, those
    neither delivered nor expired (as approximate as its counts, never below 0)."""
    return max(0, recipients - delivered - expired)


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
    # False: a `store:false` broadcast or multicast whose receipt keeps counts only. What
    # was not written to a connection is kept nowhere, so once its job has ended its
    # queued are expired (`push_service.services.receipts`).
    kept: bool = True


@dataclass(slots=True)  # not frozen: one per message; frozen costs 5x to build
class NewReceipt:
    """The router's record of a push as it was sent: its recipients and their states."""

    push_id: str
    mode: str  # "p2p", "multicast", "broadcast"
    recipients: int
    online: int
    # uid -> state (a counts-only receipt counts the delivered and expired of them)
    states: Mapping[str, str] = field(default_factory=dict)
    # For the message.unacked webhook: the message's own fields, kept with the receipt.
    meta: Mapping[str, str] = field(default_factory=dict)
    # A stored push: each uid's position in its log (a slot-tagged push's receipt keeps
    # them, and derives acks from them).
    positions: Mapping[str, int] = field(default_factory=dict)
    # False: a `store:false` push (a counts-only receipt keeps it: `Counts.kept`).
    kept: bool = True


@dataclass(frozen=True, slots=True)
class RecipientPage:
    uids: list[str]
    cursor: str | None  # pass it back for the next page; None: that was the last


def listed(state: str) -> frozenset[str]:
    """The states the list `state` names (`LISTS`); InvalidInput for any other name."""
    wanted = LISTS.get(state)
    if wanted is None:
        raise InvalidInput("state", "must be acked, unacked or queued")
    return wanted


def recipient_page(
    states: Mapping[str, str], wanted: frozenset[str], cursor: str | None, limit: int
) -> RecipientPage:
    """Up to `limit` uids of `states` (uid -> state) in a state of `wanted` (`listed`),
    in uid order after `cursor` (None: from the first)."""
    uids = sorted(u for u, s in states.items() if s in wanted and (cursor is None or u > cursor))
    page = uids[:limit]
    return RecipientPage(page, page[-1] if len(uids) > limit else None)


class ReceiptLog(Protocol):
    """The router's writes."""

    async def record(self, receipt: NewReceipt, listable: bool, due_ms: int = 0) -> None:
        """Write (or merge into) a push's receipt; states never move down. `due_ms`:
        when its message.unacked webhook event is due (0: none)."""
        ...

    async def record_many(self, receipts: Sequence[tuple[NewReceipt, bool, int]]) -> None:
        """`record` for many (receipt, listable, due_ms) in one round trip."""
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


PREVIEW_BYTES = 256


def preview_of(content_json: bytes, limit: int = PREVIEW_BYTES) -> str:
    """The content's JSON text cut to at most `limit` bytes, never inside a character."""
    return content_json[:limit].decode(errors="ignore")


def message_meta(message: Message, preview: bool) -> dict[str, str]:
    """What a `message.unacked` event says of the message, kept with its receipt."""
    meta = {"mi": message.msg_id, "mt": str(message.msg_type), "fr": message.sender}
    if preview:
        meta["pv"] = preview_of(message.content_json)
    return meta


def p2p_receipt(
    message: Message,
    uids: Sequence[str],
    outcome: PushOutcome,
    meta: Mapping[str, str],
    store: bool = True,
    ttl_passed: bool = False,
) -> NewReceipt:
    """Delivered, or queued; expired where a gateway found its ttl_s passed, and where a
    `store:false` push reached no connection of a recipient (it is kept nowhere)."""
    delivered = set(outcome.delivered)
    # A gateway answers EXPIRED past the push's ttl_s, or past its call's deadline; in
    # the second case it is still in the inbox (queued), in the first it never will be.
    expired = set(outcome.expired) if ttl_passed else set()
    missed = QUEUED if store else EXPIRED
    states = {
        uid: DELIVERED if uid in delivered else EXPIRED if uid in expired else missed
        for uid in uids
    }
    online = len(outcome.delivered) + len(outcome.failed)
    return NewReceipt(message.push_id, "p2p", len(uids), online, states, meta, outcome.positions)


def split_acked(uids: Sequence[str], states: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(acked, unacked) of `uids`, in their order."""
    acked = [u for u in uids if states.get(u) == ACKED]
    done = set(acked)
    return acked, [u for u in uids if u not in done]
