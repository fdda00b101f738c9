"""The recovery store's seam (no Redis): what the router writes and the gateway reads.

Three kinds of record, each bounded in count and in time (`RecoveryLimits`):

- a user's **P2P log**: every stored P2P message to the user, one entry each, numbered
  by a dense per-user sequence; kept for the recovery window;
- a user's **inbox**: every stored P2P message of the user until one of the user's
  devices acks it (a client ack, `socket_gateway.acks`), for the inbox TTL at most;
  a connection is written the whole inbox when it starts. It is not a record of its
  own: it is the P2P log after the user's acked position, which an ack moves (the log
  keeps what is in the inbox past the window);
- a topic's **batch log**: every broadcast or multicast batch, one entry per batch (never
  one per recipient), numbered by a dense per-topic sequence; the gateways deliver a
  topic's batches in that order, and replay from it.

Dense sequences make loss visible: a resume that finds `since+1 .. head` all present
and inside the window is complete; a hole (trimmed, expired, or a store that lost its
data) makes it `complete: false`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from shared.batches import message_of
from shared.models import Message
from shared.positions import seq_of
from shared.proto import gateway_pb2
from shared.wire import push_prefix

if TYPE_CHECKING:
    from shared.settings import FleetSettings

__all__ = [
    "OFFLINE_TOPIC",
    "ContentWrites",
    "Entry",
    "LoggedBatch",
    "RecoveryLimits",
    "RecoveryLog",
    "RecoveryReads",
    "TopicHistory",
    "TopicSpan",
    "UserHistory",
]

# The log of multicast recipients who had no route when the multicast was resolved: no
# gateway subscribes to it; a resuming client's gateway reads it.
OFFLINE_TOPIC = "offline"


@dataclass(frozen=True, slots=True)
class RecoveryLimits:
    window_s: float = 300.0  # IMROUTE_RECOVERY_WINDOW_S
    user_max: int = 1000  # IMROUTE_RECOVERY_USER_MAX: P2P log entries per user
    topic_max: int = 2000  # IMROUTE_RECOVERY_TOPIC_MAX: batches per topic
    inbox_ttl_s: float = 86_400.0  # IMROUTE_INBOX_TTL_S
    inbox_max: int = 100  # IMROUTE_INBOX_MAX: per user, oldest dropped first
    content_ttl_s: float = 3900.0  # IMROUTE_BUS_CONTENT_TTL_S: past a push's last batch
    content_inline_max: int = 1024  # IMROUTE_BUS_CONTENT_INLINE_MAX: bytes, else stored once
    legacy_writes: bool = False  # IMROUTE_INBOX_LEGACY_WRITES: the old inbox written too
    # IMROUTE_RECEIPTS_TTL_S: a P2P receipt reads its recipients' acked positions, which
    # live in their sequences, so a sequence outlives the receipts of what it numbered.
    receipts_ttl_s: float = 86_400.0

    @classmethod
    def from_settings(cls, s: FleetSettings) -> RecoveryLimits:
        return cls(
            s.recovery_window_s,
            s.recovery_user_max,
            s.recovery_topic_max,
            s.inbox_ttl_s,
            s.inbox_max,
            s.bus_content_ttl_s,
            s.bus_content_inline_max,
            s.inbox_legacy_writes,
            s.receipts_ttl_s,
        )

    @property
    def window_ms(self) -> int:
        return int(self.window_s * 1000)

    @property
    def inbox_ttl_ms(self) -> int:
        return int(self.inbox_ttl_s * 1000)

    @property
    def user_seq_ttl_ms(self) -> int:
        """How long a user's sequence lives past its last append: a window past the log
        and the inbox it numbers, so a position never meets a restarted count while the
        entries it names could still be read; and past the receipts of its pushes, which
        read the acked position it holds."""
        receipts_ms = int(self.receipts_ttl_s * 1000)
        return max(self.window_ms, self.inbox_ttl_ms, receipts_ms) + self.window_ms


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored P2P message of one user."""

    seq: int
    message: Message
    expires_ms: int = 0


@dataclass(frozen=True, slots=True)
class UserHistory:
    """A user's P2P log after a position, and the whole inbox; `head` is the last seq."""

    head: int
    log: list[Entry] = field(default_factory=list)
    inbox: list[Entry] = field(default_factory=list)


class LoggedBatch:
    """One batch of a topic log, with what replays ask of it worked out once: a storm of
    resumes asks each batch "does it name this uid?" thousands of times."""

    __slots__ = ("_message", "_prefix", "_uids", "batch", "seq")

    def __init__(self, batch: gateway_pb2.Batch) -> None:
        self.batch = batch
        self.seq = seq_of(batch.epoch, batch.seq)
        self._uids: frozenset[str] | None = None
        self._message: Message | None = None
        self._prefix: bytes | None = None

    def detached(self) -> LoggedBatch:
        """A copy whose batch may be changed (its stored content filled in) leaving this
        one, which resumes share, as it is; the uids are shared, not copied."""
        batch = gateway_pb2.Batch()
        batch.CopyFrom(self.batch)
        del batch.uids[:]
        copy = LoggedBatch(batch)
        copy._uids = self._uids if self._uids is not None else frozenset(self.batch.uids)
        return copy

    def addresses(self, uid: str) -> bool:
        if self.batch.everyone:
            return True
        if self._uids is None:
            self._uids = frozenset(self.batch.uids)
        return uid in self._uids

    @property
    def message(self) -> Message:
        if self._message is None:
            self._message = message_of(self.batch)
        return self._message

    @property
    def prefix(self) -> bytes:
        """The push frame up to its `pos` (`shared.wire.push_prefix`)."""
        if self._prefix is None:
            self._prefix = push_prefix(self.message)
        return self._prefix


@dataclass(frozen=True, slots=True)
class TopicHistory:
    """A topic's batches after a position, in seq order; `head` is the last seq."""

    head: int
    batches: list[LoggedBatch] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TopicSpan:
    """A budgeted read of a topic log (`RecoveryReads.read_span`): the log's head, the
    batches read in seq order (stored content not filled in) and the bytes each took in
    the log. `over`: the range was over the budget; the batches are then its newest that
    fit, every one after `start` (a position below `start` is over the budget too)."""

    head: int
    batches: list[LoggedBatch] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    over: bool = False
    start: int = 0


class ContentWrites(Protocol):
    """Where a broadcast or multicast push's content is stored once (`content`)."""

    def stores(self, content: bytes) -> bool:
        """Whether this content is stored once rather than carried by every batch."""
        ...

    async def hold(self, msg_id: str, content: bytes) -> None:
        """Store it before the push's first batch; keep it while the push publishes."""
        ...


class RecoveryLog(Protocol):
    """The router's writes."""

    @property
    def content(self) -> ContentWrites:
        """Where pushes' content is stored once for all their batches."""
        ...

    async def append_queued(
        self, message: Message, uids: Sequence[str], expires_ms: int
    ) -> tuple[list[int], int]:
        """Log `message` for each uid (one small script per uid): into the user's log,
        whose entries after the user's acked position are the user's inbox, where it
        stays until a device acks it. (The seqs, in order; how many older entries the
        inbox bound pushed out of the inboxes to make room.)"""
        ...

    def append_queued_many(
        self, items: Sequence[tuple[Message, Sequence[str], int]]
    ) -> Awaitable[list[tuple[list[int], int]]]:
        """`append_queued` for many (message, uids, expires_ms) in one round trip; each
        one's answer, in order. A store may send the writes when called, before they are
        awaited (the P2P path awaits its route look-up of the same loop turn first)."""
        ...

    async def append_batch(self, topic: str, batch: gateway_pb2.Batch) -> int:
        """Log one bus batch of `topic`; its seq."""
        ...


class RecoveryReads(Protocol):
    """The gateway's reads (and its one write: how far each user's devices acked)."""

    async def read_user(self, uid: str, after: int | None) -> UserHistory:
        """The P2P log after `after` (nothing when None) and the inbox: the log's entries
        after the user's acked position (the last `inbox_max`)."""
        ...

    async def read_users(self, wanted: Sequence[tuple[str, int | None]]) -> list[UserHistory]:
        """`read_user` for many (uid, after) at once."""
        ...

    async def ack(self, wanted: Sequence[tuple[str, int]]) -> list[None]:
        """Move each (uid, seq) user's acked position up to `seq`, never back: what a
        device acked leaves the user's inbox. A seq of another epoch than the user's
        log (one Redis lost) moves nothing."""
        ...

    async def read_topic(self, topic: str, after: int, upto: int | None = None) -> TopicHistory:
        """A topic's batches with `after < seq <= upto` (to the head when None), each
        with its content; one whose stored content is gone is left out (a hole)."""
        ...

    async def read_span(
        self, topic: str, after: int, upto: int | None, max_entries: int, max_bytes: int
    ) -> TopicSpan:
        """`read_topic` within a budget, read backward from `upto`: over `max_entries`
        batches or `max_bytes` bytes of log entries, only the newest that fit (`over`,
        `start`); stops reading at the first entry past it. Stored content is left for
        `fill_content` (a resume needs only its user's)."""
        ...

    async def fill_content(self, batches: Sequence[gateway_pb2.Batch]) -> list[bool]:
        """Give bus batches that name stored content their content, in place; per
        batch, whether it has it now (False: gone, not to be delivered)."""
        ...

    async def heads(self, topics: Sequence[str]) -> list[int]:
        """The last seq of each topic (0 when none yet)."""
        ...
