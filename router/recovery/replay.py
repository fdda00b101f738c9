"""Pure replay planning: from a position and what the logs hold, what to send, in order.

Per log, every entry after the position is replayed if it is addressed to the user,
inside the recovery window and not past its own expiry. The logs are merged by
acceptance time, each keeping its own order (P2P by seq, batches by bus order). The
replay is `complete` when every log had each seq from the position to its head (the
sequences are dense, so a hole is a loss: trimmed, out of the window, or a store that
lost its data), and when the position was one of ours.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from router.recovery.base import Entry, TopicHistory, UserHistory
from shared.models import Message
from shared.positions import Pos, epoch_of, first_after

__all__ = ["P2P", "Replay", "ReplayItem", "plan_replay"]

P2P = "p"


@dataclass(frozen=True, slots=True)
class ReplayItem:
    """One message to send again: which log (`p`, `b`, `o` or `g`) and its seq there."""

    log: str
    seq: int
    message: Message
    prefix: bytes | None = None  # its frame up to `pos`, when already built (batches)


@dataclass(slots=True)
class Replay:
    items: list[ReplayItem] = field(default_factory=list)
    complete: bool = True
    # Inbox entries the position covers: the client had them (it saves its position once
    # it is done with a push, as it acks), so the position acks them: out of the inbox.
    # Those it sends stay in the inbox until a device acks them; those past their ttl_s
    # or the inbox TTL are left out, and leave when a later ack or the log's trim passes.
    inbox_covered: list[Entry] = field(default_factory=list)
    # Messages left out because their ttl_s had passed (never sent late), each counted
    # once; and the push ids of the inbox's, never written to this user, whose receipts
    # the gateway marks expired (`socket_gateway.acks.report_expired`).
    expired: int = 0
    expired_ids: dict[str, None] = field(default_factory=dict)
    expired_seqs: set[int] = field(default_factory=set, init=False, repr=False)


def plan_replay(
    uid: str,
    since: Pos | None,
    user: UserHistory,
    topics: dict[str, TopicHistory],
    now_ms: int,
    window_ms: int,
    inbox_ttl_ms: int,
    *,
    since_valid: bool = True,
) -> Replay:
    """The replay for `uid` resuming from `since` (None: a new connection, inbox only).

    `topics` maps each log letter (`b`, `o`, `g`) to what was read of it after the
    position's seq for that log. `since_valid` False: a `since` was sent but is not a
    position of ours, so whatever it stood for may be missing.
    """
    replay = Replay(complete=since_valid)
    cutoff = now_ms - window_ms
    p2p: list[ReplayItem] = []
    seen: set[int] = set()
    if since is not None:
        if since.p > user.head:
            replay.complete = False  # a position from a log that is gone
        if not _dense(since.p, user.head, (e.seq for e in user.log)):
            replay.complete = False
        for e in user.log:
            if e.message.ts_ms < cutoff:
                replay.complete = False
                continue
            if _expired(e, now_ms, replay):
                continue
            seen.add(e.seq)
            p2p.append(ReplayItem(P2P, e.seq, e.message))
    # A position past the head is from a log that is gone: it covers nothing of this one.
    covered = since.p if since is not None and since.p <= user.head else 0
    _inbox_items(user, covered, now_ms, inbox_ttl_ms, seen, p2p, replay)
    p2p.sort(key=lambda item: item.seq)
    streams: list[list[ReplayItem]] = [p2p]
    if since is not None:
        for log, after in (("b", since.b), ("o", since.o), ("g", since.g)):
            history = topics.get(log)
            if history is None:
                continue
            streams.append(_topic_items(uid, log, after, history, cutoff, now_ms, replay))
    replay.items = list(heapq.merge(*streams, key=lambda item: item.message.ts_ms))
    return replay


def _inbox_items(
    user: UserHistory,
    covered: int,
    now_ms: int,
    inbox_ttl_ms: int,
    seen: set[int],
    p2p: list[ReplayItem],
    replay: Replay,
) -> None:
    """What no device acked, but what this client's position says it had (`covered`)."""
    for e in user.inbox:
        if e.message.ts_ms < now_ms - inbox_ttl_ms:
            continue
        if _expired(e, now_ms, replay):
            # Not one this client's position covers: it had that one before it expired.
            if e.seq > covered:
                replay.expired_ids[e.message.push_id] = None
            continue
        if e.seq <= covered:
            replay.inbox_covered.append(e)
        elif e.seq not in seen:
            seen.add(e.seq)
            p2p.append(ReplayItem(P2P, e.seq, e.message))


def _topic_items(
    uid: str,
    log: str,
    after: int,
    history: TopicHistory,
    cutoff: int,
    now_ms: int,
    replay: Replay,
) -> list[ReplayItem]:
    if after > history.head or not _dense(after, history.head, (b.seq for b in history.batches)):
        replay.complete = False
    items: list[ReplayItem] = []
    for logged in history.batches:
        if logged.seq <= after or not logged.addresses(uid):
            continue
        message = logged.message
        if message.ts_ms < cutoff:
            replay.complete = False
            continue
        expires_ms = logged.batch.expires_ms
        if expires_ms and now_ms > expires_ms:
            replay.expired += 1
            continue
        items.append(ReplayItem(log, logged.seq, message, logged.prefix))
    return items


def _dense(after: int, head: int, seqs: Iterator[int]) -> bool:
    """Whether `seqs` (ascending) are exactly those after `after` through `head`: after+1
    .. head within one epoch; from the log's first when `after` is 0 (nothing yet). A
    position of another epoch than the log's now stood in a log that is gone: not."""
    if after and head and epoch_of(after) != epoch_of(head):
        return False
    expected = first_after(after, head)
    for seq in seqs:
        if seq <= after:
            continue
        if seq != expected:
            return False
        expected += 1
    return expected > head


def _expired(e: Entry, now_ms: int, replay: Replay) -> bool:
    """Whether `e` is past its ttl_s; counted once, in the log or the inbox."""
    if e.expires_ms and now_ms > e.expires_ms:
        if e.seq not in replay.expired_seqs:
            replay.expired_seqs.add(e.seq)
            replay.expired += 1
        return True
    return False
