"""Client acks on the gateway: what a connection's `{"type":"ack","pos"}` covers leaves
its user's inbox, and counts in the receipts of the pushes it names.

Acks arrive by the thousand a second; none of them is a Redis round trip of its own.
Each is taken apart on arrival (`LocalConnections.ack`, no I/O) and its effects wait
here: how far each user's devices acked (the user's inbox is the log after that
position, so one position per user says it all), and the receipt updates, per push.
A stored P2P push's receipt derives its acks from that position (`derives_ack`): it
gets no mark of its own, so a flush of acks of P2P pushes writes one position per user.
One flush a FLUSH_S at most writes them all, in one pipeline each for the positions and
the receipts. A write that fails is logged and counted, and what it held goes back for
the next flush (up to MAX_PENDING), because an inbox entry that is never acked is sent
again on every connect: for as long as an outage lasts, but only once for a bug, after
which it is dropped (counted) rather than hold every later ack behind it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from router.receipts.base import ACKED, DELIVERED, EXPIRED, ReceiptUpdates, derives_ack
from shared.clock import Clock
from shared.errors import ImrouteError
from shared.keys import slot_tagged
from shared.throttled import ThrottledLine
from socket_gateway.connections import ClientConn, LocalConnections
from socket_gateway.tracing import GatewayTracing

__all__ = ["FLUSH_S", "AckCounts", "AckReporter", "InboxAcks", "Report", "report_expired"]

# (state, push_id, uids): `AckReporter.report`, as the replay, gap fills and move tails
# are given it.
Report = Callable[[str, str, Sequence[str]], None]


def report_expired(report: Report, push_id: str, uid: str) -> None:
    """A stored message left out for its ttl_s, never written to `uid`: expired in its
    receipt where that receipt would otherwise read the acks of what came after as its
    own (a slot-tagged push's, `router.receipts.base.derive`); others keep it queued."""
    if slot_tagged(push_id):
        report(EXPIRED, push_id, (uid,))


log = logging.getLogger(__name__)

# The part of a flush that writes the users' acked positions (the others: receipt states)
_INBOX = "inbox"
# Acks (and delivery reports) wait at most this long before they are written.
FLUSH_S = 0.05
# Updates held at most (users' inbox entries plus receipt uids); past it, new ones are
# dropped and counted: Redis has been failing for a while.
MAX_PENDING = 200_000


class InboxAcks(Protocol):
    async def ack(self, wanted: Sequence[tuple[str, int]]) -> list[None]: ...


class AckCounts:
    __slots__ = ("acked", "acks", "bad", "dropped", "failed_flushes", "flushes")

    def __init__(self) -> None:
        self.acks = 0  # ack frames that covered something
        self.acked = 0  # pushes they covered
        self.bad = 0  # ack frames ignored: malformed, unknown, ahead, or already acked
        self.flushes = 0
        self.failed_flushes = 0
        self.dropped = 0  # updates dropped past MAX_PENDING, or failed twice with a bug


@dataclass(slots=True, eq=False)
class AckReporter:
    """Takes acks and delivery reports from connections, writes them in batches."""

    conns: LocalConnections
    inbox: InboxAcks
    receipts: ReceiptUpdates | None
    clock: Clock
    flush_s: float = FLUSH_S
    # Each flush's acks of traced pushes are spans (tracing on).
    tracing: GatewayTracing | None = None
    inbox_max: int = 100  # IMROUTE_INBOX_MAX (`derives_ack`)
    # Per user, the furthest P2P seq its devices acked (a later epoch's is further).
    _acked: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _marks: dict[str, dict[str, set[str]]] = field(
        default_factory=lambda: {ACKED: {}, DELIVERED: {}, EXPIRED: {}}, init=False, repr=False
    )
    # Tracing on: acks the receipts derive, by push (their spans, with the marks').
    _derived: dict[str, set[str]] = field(default_factory=dict, init=False, repr=False)
    _pending: int = field(default=0, init=False, repr=False)
    _timer: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)
    _flushing: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _line: ThrottledLine = field(init=False, repr=False)
    # A flush failed with a bug (not an outage) and its updates were kept for one more try.
    _bug_kept: bool = field(default=False, init=False, repr=False)
    _bug_line: ThrottledLine = field(init=False, repr=False)
    _dropped_line: ThrottledLine = field(init=False, repr=False)
    counts: AckCounts = field(default_factory=AckCounts, init=False)

    def __post_init__(self) -> None:
        now = self.clock.monotonic
        self._line = ThrottledLine(
            log, "could not write acks (kept for the next try): %(exc)s", now=now
        )
        self._bug_line = ThrottledLine(
            log, "writing acks failed (kept for one more try)", level=logging.ERROR, now=now
        )
        self._dropped_line = ThrottledLine(
            log,
            "writing acks failed again: %(n)d updates dropped (%(total)d in all)",
            level=logging.ERROR,
            now=now,
        )

    def metrics(self) -> dict[str, tuple[str, float]]:
        """The acks' counters for /metrics: name -> (help, value)."""
        c = self.counts
        return {
            "acks": ("Client ack frames that acked pushes", c.acks),
            "acked_pushes": ("Pushes (per connection) those acks covered", c.acked),
            "bad_acks": (
                "Client ack frames ignored: malformed, unknown, ahead of what was sent, or "
                "already acked",
                c.bad,
            ),
            "ack_flush_failures": (
                "Writes of acks to Redis that failed (kept for the next one)",
                c.failed_flushes,
            ),
            "ack_updates_dropped": (
                "Ack and delivery updates dropped while Redis kept failing, after a "
                "write failed twice with a bug, or not written at shutdown",
                c.dropped,
            ),
        }

    # ------------------------------------------------------------------ the connections' side

    def on_ack(self, conn: ClientConn | None, pos: str) -> None:
        """One ack frame (`pos` empty: malformed). Never closes the connection."""
        acked = self.conns.ack(conn, pos) if conn is not None and pos else None
        c = self.counts
        if not acked:
            c.bad += 1
            return
        c.acks += 1
        c.acked += len(acked)
        uid = conn.uid if conn is not None else ""
        furthest = max((seq for _, log_, seq, _ in acked if log_ == "p" and seq), default=0)
        if conn is not None and conn.ack_cap is not None:
            furthest = min(furthest, conn.ack_cap)  # a hole it was never written
        if furthest:
            self._ack(uid, furthest)
        traced = self.tracing is not None
        inbox_max = self.inbox_max
        for _, log_, seq, push_id in acked:
            if not push_id:
                continue
            if log_ == "p" and derives_ack(push_id, seq, furthest, inbox_max):
                if traced:  # the receipt needs no mark; the trace has its span
                    self._derived.setdefault(push_id, set()).add(uid)
                continue
            self._add(ACKED, push_id, uid)
        self._pending += len(acked)
        self._schedule()

    def _ack(self, uid: str, seq: int) -> None:
        """`uid`'s devices acked its log up to `seq`: kept if it is the furthest yet."""
        if seq > self._acked.get(uid, 0):
            if uid not in self._acked:
                self._pending += 1
            self._acked[uid] = seq

    def report(self, state: str, push_id: str, uids: Sequence[str]) -> None:
        """Recipients of a push that were delivered (or expired) outside the P2P call's
        answer: by a replay, a gap fill, or a bus batch."""
        if self.receipts is None or not push_id or not uids:
            return
        for uid in uids:
            self._add(state, push_id, uid)
        self._pending += len(uids)
        self._schedule()

    def _add(self, state: str, push_id: str, uid: str) -> None:
        if self._pending >= MAX_PENDING:
            self.counts.dropped += 1
            return
        by_push = self._marks[state]
        uids = by_push.get(push_id)
        if uids is None:
            by_push[push_id] = {uid}
        else:
            uids.add(uid)

    @property
    def pending(self) -> bool:
        """Whether updates wait for a flush, or one is being written."""
        flushing = self._flushing is not None and not self._flushing.done()
        return bool(self._pending or flushing or self._timer is not None)

    # ------------------------------------------------------------------ the flushes

    def _schedule(self) -> None:
        if self._timer is None and (self._flushing is None or self._flushing.done()):
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.flush_s, self._start_flush)

    def _start_flush(self) -> None:
        self._timer = None
        self._flushing = asyncio.ensure_future(self._flush_then_again())

    async def _flush_then_again(self) -> None:
        try:
            await self.flush()
        finally:
            # What arrived during the flush goes in the next one: scheduled once this
            # flush no longer counts as running (else nothing would schedule it until
            # the next ack, and the last acks of a burst would wait for ever).
            self._flushing = None
            if self._pending:
                self._schedule()

    async def flush(self) -> None:
        """Write what waits; what arrives meanwhile goes in the next flush."""
        acked, marks, derived = self._take()
        if not acked and not any(marks.values()):
            return
        self.counts.flushes += 1
        writes: list[Awaitable[object]] = []
        parts: list[str] = []  # _INBOX, or the receipt state each write marks
        receipts = self.receipts
        if receipts is not None:
            # Delivered before acked: a state only moves up, so the order is moot for
            # the outcome; it keeps a receipt's counts plausible meanwhile.
            for state in (EXPIRED, DELIVERED, ACKED):
                if marks[state]:
                    by_push = {p: sorted(u) for p, u in marks[state].items()}
                    writes.append(receipts.mark(state, by_push))
                    parts.append(state)
        results: list[object] = []
        if acked and parts[:1] == [EXPIRED]:
            # Entries a replay left out for their ttl_s are marked before the acked
            # positions pass them: read in between, such an entry would read acked.
            results += await asyncio.gather(writes.pop(0), return_exceptions=True)
        if acked:
            writes.append(self.inbox.ack(list(acked.items())))
            parts.append(_INBOX)
        results += await asyncio.gather(*writes, return_exceptions=True)
        failed = {p: r for p, r in zip(parts, results, strict=True) if isinstance(r, BaseException)}
        if self.tracing is not None:
            self.tracing.acked(_union(derived, marks[ACKED]), written=not failed)
        if not failed:
            self._bug_kept = False
            return
        # Only the writes that failed are made again.
        self.counts.failed_flushes += 1
        unwritten = {s: marks[s] if s in failed else {} for s in marks}
        self._failed(next(iter(failed.values())), acked if _INBOX in failed else {}, unwritten)

    def _failed(
        self, exc: BaseException, acked: dict[str, int], marks: dict[str, dict[str, set[str]]]
    ) -> None:
        """Writes of a flush failed: an outage's updates are kept for the next flush for
        as long as it lasts (up to MAX_PENDING); a bug's for one more try, then dropped
        and counted, so the acks that come after are not held behind it for ever."""
        if isinstance(exc, ImrouteError):
            self._bug_kept = False
            self._put_back(acked, marks)
            self._line.note(exc=exc)
            return
        if not self._bug_kept:
            self._bug_kept = True
            self._put_back(acked, marks)
            self._bug_line.note(exc_info=exc)
            return
        self._bug_kept = False
        n = _updates(acked, marks)
        self.counts.dropped += n
        self._dropped_line.note(n, exc_info=exc)

    def _put_back(self, acked: dict[str, int], marks: dict[str, dict[str, set[str]]]) -> None:
        for uid, seq in acked.items():
            self._ack(uid, seq)
        for state, by_push in marks.items():
            for push_id, uids in by_push.items():
                for uid in uids:
                    self._add(state, push_id, uid)
                self._pending += len(uids)

    async def aclose(self) -> None:
        """Write what waits (a shutdown must not lose acks it has); what the last flush
        could not write is lost with the process, and counted and said as such."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        await self.flush()
        acked, marks, _ = self._take()  # what the last flush put back
        if lost := _updates(acked, marks):
            self.counts.dropped += lost
            log.error(
                "%d ack and receipt update(s) not written at shutdown (Redis did not take "
                "them): their inbox entries come back on the users' next connect, and "
                "their receipts do not say acked (imroute_gateway_ack_updates_dropped_total)",
                lost,
            )

    def _take(
        self,
    ) -> tuple[dict[str, int], dict[str, dict[str, set[str]]], dict[str, set[str]]]:
        """What waits for a flush, taken: acked positions, receipt marks, derived acks."""
        acked, self._acked = self._acked, {}
        marks, self._marks = self._marks, {ACKED: {}, DELIVERED: {}, EXPIRED: {}}
        derived, self._derived = self._derived, {}
        self._pending = 0
        return acked, marks, derived


def _updates(acked: dict[str, int], marks: dict[str, dict[str, set[str]]]) -> int:
    """How many updates: acked positions and receipt marks."""
    return len(acked) + sum(len(uids) for by_push in marks.values() for uids in by_push.values())


def _union(a: dict[str, set[str]], b: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each push's uids in either (a push can have acks both derived and marked)."""
    return {p: a.get(p, set()) | b.get(p, set()) for p in a.keys() | b.keys()}
