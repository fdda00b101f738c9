"""Topic-log reads for resumes, shared by range and bounded by the resume budget.

A storm of clients (thousands reconnecting after a gateway restart) resumes from about
the same place in each topic log, rarely the very same one. Each topic keeps one *span*:
the batches last read of its log, every seq in (lo, hi] of one epoch, for `SPAN_TTL_S`
after it was last used. A resume whose range lies inside it reads nothing; one that
reaches below or above it reads only the missing part, and the span grows by it. The
reads of one topic are made one at a time, so resumes that arrive together wait for the
read that brings their range instead of each making its own (single flight).

Every range is held to the budget (`ResumeLimits`) from where it starts to where it
ends, whether it comes from the span or from Redis: over `max_entries` batches it is not
read at all (decided from the head), over `max_bytes` of log entries the read stops at
the first byte past it (`RecoveryReads.read_span`). Either way the answer is None, and
the resume is incomplete. The highest range found over is remembered as long as a span
is: a range that holds it is over too, and is refused without a read (a forged place
sent again and again costs Redis nothing). A span is kept within twice the budget, and
`MAX_SPANS` of them, so what sharing holds in memory is bounded too.

Batches come without their stored content (a push's content over
IMROUTE_BUS_CONTENT_INLINE_MAX): `fill_for` fetches it for the batches a resuming user
is named in, never for everyone else's.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate

from router.recovery.base import LoggedBatch, RecoveryReads, TopicHistory, TopicSpan
from shared.clock import Clock
from shared.positions import counter_of, epoch_of, seq_of
from socket_gateway.resume_budget import ResumeLimits, start_of

__all__ = ["MAX_SPANS", "SPAN_TTL_S", "TopicSpans", "fill_for"]

# A span unused this long is dropped: a storm's resumes come within a second or two,
# and a span is correct however old (a resume stands at the head it was given, and the
# live path brings what came after).
SPAN_TTL_S = 2.0
MAX_SPANS = 32  # topics with a span at once (the gateway's three, and moves' groups)


@dataclass(slots=True)
class _Span:
    lo: int  # every seq in (lo, hi] was read (those missing are gone from the log)
    hi: int
    used: float  # when it was last used (monotonic)
    read_at: float  # when its `hi` was read
    seqs: list[int] = field(default_factory=list)
    batches: list[LoggedBatch] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # each batch's bytes in the log
    cum: list[int] = field(default_factory=lambda: [0])  # bytes of batches[:i]

    def take(self, lo: int, hi: int) -> tuple[list[LoggedBatch], int]:
        """The batches in (lo, hi] and their bytes in the log."""
        i, j = bisect_right(self.seqs, lo), bisect_right(self.seqs, hi)
        return self.batches[i:j], self.cum[j] - self.cum[i]

    def add(self, got: TopicSpan, lo: int, hi: int) -> None:
        """What a read brought of (lo, hi], next to (lo, hi] being (self.hi, ...] or
        (..., self.lo]; the span then covers both."""
        new = [(b, n) for b, n in zip(got.batches, got.sizes, strict=True) if lo < b.seq <= hi]
        at = 0 if hi <= self.lo else len(self.seqs)
        self.seqs[at:at] = [b.seq for b, _ in new]
        self.batches[at:at] = [b for b, _ in new]
        self.sizes[at:at] = [n for _, n in new]
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        self.cum = [0, *accumulate(self.sizes)]

    def trim(self, limits: ResumeLimits) -> None:
        """Keep at most twice the budget, from the top: no resume needs more."""
        floor = max(self.lo, self.hi - 2 * limits.max_entries)
        cut = bisect_left(self.cum, self.cum[-1] - 2 * limits.max_bytes)
        if cut > 0:
            floor = max(floor, self.seqs[cut - 1])
        k = bisect_right(self.seqs, floor)
        if k:
            del self.seqs[:k], self.batches[:k], self.sizes[:k]
            self.cum = [0, *accumulate(self.sizes)]
        self.lo = floor


class TopicSpans:
    def __init__(self, reads: RecoveryReads, clock: Clock, limits: ResumeLimits) -> None:
        self._reads = reads
        self._clock = clock
        self._limits = limits
        self._spans: dict[str, _Span] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.reads = 0  # budgeted reads that went to Redis
        self.read_bytes = 0  # bytes of log entries they brought
        self.over = 0  # ranges refused: over the budget
        # topic -> (lo, upto, when) of the highest range found over the budget lately
        self._over: dict[str, tuple[int, int, float]] = {}

    async def read(self, topic: str, after: int, upto: int | None) -> TopicHistory | None:
        """The batches with `after < seq <= upto`, in a history whose head is `upto`;
        upto None: to the log's head (or to the end of a span read in the last
        SPAN_TTL_S). None when the range is over the budget."""
        lo = after if upto is None else start_of(after, upto)
        history: TopicHistory | None = None
        if upto is not None and lo == upto:
            return TopicHistory(upto)  # nothing after the position
        if upto is None or (
            counter_of(upto) - counter_of(lo) <= self._limits.max_entries  # from the head
            and not self._known_over(topic, lo, upto)
        ):
            lock = self._locks.get(topic)
            if lock is None:
                lock = self._locks[topic] = asyncio.Lock()
            async with lock:
                if upto is None or not self._known_over(topic, lo, upto):  # waited: again
                    history = await self._read(topic, lo, upto)
                    if history is None and upto is not None:
                        self._note_over(topic, lo, upto)
        if history is None:
            self.over += 1
        return history

    def _known_over(self, topic: str, lo: int, upto: int) -> bool:
        """Whether (lo, upto] holds a range found over the budget lately: it is over too
        (a log's entries only grow in number, and its bytes with them), and is refused
        without a read, so a forged place repeated costs Redis nothing."""
        known = self._over.get(topic)
        now = self._clock.monotonic()
        if known is None or now - known[2] > SPAN_TTL_S or not _same_epoch(known[1], upto):
            return False
        if lo <= known[0] and upto >= known[1]:
            self._over[topic] = (known[0], known[1], now)
            return True
        return False

    def _note_over(self, topic: str, lo: int, upto: int) -> None:
        """Remember the highest place found over the budget (it covers the most)."""
        known = self._over.get(topic)
        now = self._clock.monotonic()
        stale = known is None or now - known[2] > SPAN_TTL_S or not _same_epoch(known[1], upto)
        if stale or known is None or lo > known[0]:
            self._over[topic] = (lo, upto, now)
        if len(self._over) > 2 * MAX_SPANS:
            self._over = {t: k for t, k in self._over.items() if now - k[2] <= SPAN_TTL_S}

    async def _read(self, topic: str, lo: int, upto: int | None) -> TopicHistory | None:
        now = self._clock.monotonic()
        span = self._spans.get(topic)
        usable = (
            span is not None
            and now - span.used <= SPAN_TTL_S
            and _same_epoch(span.hi, lo if upto is None else upto)
        )
        if span is not None and usable and span.lo <= lo <= span.hi:
            return await self._up(topic, span, lo, upto, now)
        if span is not None and usable and upto is not None and lo < span.lo <= upto <= span.hi:
            return await self._down(topic, span, lo, upto, now)
        return await self._fresh(topic, lo, upto, now)

    async def _up(
        self, topic: str, span: _Span, lo: int, upto: int | None, now: float
    ) -> TopicHistory | None:
        """A range that starts inside the span: what it lacks above is read."""
        if upto is not None and upto <= span.hi:
            return self._answer(span, lo, upto, now)
        if upto is None and now - span.read_at < SPAN_TTL_S:
            return self._answer(span, lo, span.hi, now)
        _, known = span.take(lo, span.hi)
        entries = self._limits.max_entries - (counter_of(span.hi) - counter_of(lo))
        got = await self._fetch(topic, span.hi, upto, entries, known)
        if got is None:
            return None
        end = _end(span.hi, upto, got)
        if not _same_epoch(end, span.hi):
            return await self._fresh(topic, lo, upto, now)  # the log started again
        span.add(got, span.hi, end)
        span.read_at = now
        return self._answer(span, lo, end, now)

    async def _down(
        self, topic: str, span: _Span, lo: int, upto: int, now: float
    ) -> TopicHistory | None:
        """A range that ends inside the span: what it lacks below is read."""
        _, known = span.take(span.lo, upto)
        got = await self._fetch(topic, lo, span.lo, self._limits.max_entries, known)
        if got is None:
            return None
        if not _same_epoch(got.head, span.hi):
            return await self._fresh(topic, lo, upto, now)  # the log started again
        span.add(got, lo, span.lo)
        return self._answer(span, lo, upto, now)

    async def _fresh(
        self, topic: str, lo: int, upto: int | None, now: float
    ) -> TopicHistory | None:
        """A range the span has nothing of: read, and kept as the topic's span."""
        got = await self._fetch(topic, lo, upto, self._limits.max_entries, 0)
        if got is None:
            return None
        end = _end(lo, upto, got)
        if not lo or not _same_epoch(lo, end):
            lo = seq_of(epoch_of(end), 0)  # read from the log's start (it started again)
        span = _Span(lo, lo, now, now)
        span.add(got, lo, end)
        self._spans.pop(topic, None)
        self._spans[topic] = span
        if len(self._spans) > MAX_SPANS:
            del self._spans[min(self._spans, key=lambda t: self._spans[t].used)]
        if len(self._locks) > 2 * MAX_SPANS:
            self._locks = {t: k for t, k in self._locks.items() if k.locked() or t in self._spans}
        return self._answer(span, lo, end, now)

    async def _fetch(
        self, topic: str, after: int, upto: int | None, entries: int, known: int
    ) -> TopicSpan | None:
        """A read of (after, upto] within what is left of the budget once `known` bytes
        of the range are held already (`entries`: batches it may bring); None: over."""
        budget = self._limits.max_bytes - known
        if budget <= 0 or entries <= 0:
            return None
        got = await self._reads.read_span(topic, after, upto, entries, budget)
        self.reads += 1
        self.read_bytes += sum(got.sizes)
        return None if got.over else got

    def _answer(self, span: _Span, lo: int, hi: int, now: float) -> TopicHistory | None:
        batches, size = span.take(lo, hi)
        lim = self._limits
        if size > lim.max_bytes or counter_of(hi) - counter_of(lo) > lim.max_entries:
            return None
        span.used = now
        span.trim(lim)  # after the answer was taken: it may reach below what is kept
        return TopicHistory(hi, batches)


def _same_epoch(a: int, b: int) -> bool:
    return not a or not b or epoch_of(a) == epoch_of(b)


def _end(after: int, upto: int | None, got: TopicSpan) -> int:
    """Where a read of (after, upto] ended: `upto`, or the head it found (none: after)."""
    if upto is not None:
        return upto
    return got.head or after


async def fill_for(
    reads: RecoveryReads, uid: str, topics: Mapping[str, TopicHistory]
) -> dict[str, TopicHistory]:
    """The histories with the stored content of the batches that name `uid` filled in
    (one round trip for all of them); one of those whose content is gone is left out (a
    hole: the resume is incomplete), as a topic read leaves it out for everyone."""
    wanted = [
        logged
        for history in topics.values()
        for logged in history.batches
        if _unfilled(logged) and logged.addresses(uid)
    ]
    if not wanted:
        return dict(topics)
    filled = await reads.fill_content([logged.batch for logged in wanted])
    gone = {id(logged) for logged, ok in zip(wanted, filled, strict=True) if not ok}
    if not gone:
        return dict(topics)
    return {
        letter: TopicHistory(h.head, [b for b in h.batches if id(b) not in gone])
        for letter, h in topics.items()
    }


def _unfilled(logged: LoggedBatch) -> bool:
    message = logged.batch.message
    return message.content_stored and not message.content_json
