"""Topic-log reads for resumes, shared by range and bounded by the resume budget.

A storm of clients (thousands reconnecting after a gateway restart) resumes from about
the same place in each topic log, rarely the very same one. Each topic keeps one *span*:
the batches last read of its log, every seq in (lo, hi] of one epoch, for `SPAN_TTL_S`
after it was last used. A resume whose range lies inside it reads nothing; one that
reaches below or above it reads only the missing part, and the span grows by it. One
read of a topic is made at a time (a *flight*): the resumes that arrive meanwhile wait
for the next one, which takes the widest range they need as it starts, and its result
or its error goes to all of them; after an error the topic's reads fail at once for
FAIL_FAST_S.

Every range is held to the budget (`ResumeLimits`): over `max_entries` batches behind
its head it is not read at all (decided from the head); a read from Redis brings at most
`max_bytes` of log entries, read backward from its top (`RecoveryReads.read_span`).
Over it, the read brings the newest batches that fit and where it ran out: they are kept
in the span, and that place is remembered for SPAN_TTL_S, so any range from below it is
over and refused without a read (a forged place, repeated or stepped forward, costs
Redis one read per topic). Either way the answer is None, and the resume is incomplete.
Spans are kept for the gateway's own topics only (`keep`), within twice the budget each
and SPANS_MAX_MEMORY all together, so what sharing holds in memory is bounded too.

Batches come without their stored content (a push's content over
IMROUTE_BUS_CONTENT_INLINE_MAX): `socket_gateway.fill_content` fetches it for the
batches a resuming user is named in, never for everyone else's.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate

from router.recovery.base import LoggedBatch, RecoveryReads, TopicHistory, TopicSpan
from shared.clock import Clock
from shared.errors import RegistryUnavailable
from shared.positions import counter_of, epoch_of, seq_of
from shared.tasks import Background
from socket_gateway.resume_budget import ResumeLimits, start_of

__all__ = ["FAIL_FAST_S", "MAX_SPANS", "SPAN_TTL_S", "TopicSpans"]

log = logging.getLogger(__name__)

# A span unused this long is dropped: a storm's resumes come within a second or two,
# and a span is correct however old (a resume stands at the head it was given, and the
# live path brings what came after).
SPAN_TTL_S = 2.0
MAX_SPANS = 32  # topics with a span at once (the gateway's three, and moves' groups)
# What all spans together may hold, estimated in memory: a batch decoded, with its uids
# worked out as a set and its push frame, takes about IN_MEMORY times its bytes in the
# log (measured: 1000 64-character uids, 66 KB in the log, 147 KB of Python objects
# besides the decoded batch itself). Over it the least recently used span goes.
IN_MEMORY = 4
SPANS_MAX_MEMORY = 32 << 20
# After a topic's read failed, its reads fail at once this long (a hung shard costs each
# resume of a storm nothing, not a timeout each, one after another).
FAIL_FAST_S = 1.0


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


class _Flight:
    """One read of a topic log for every resume waiting on it: the widest range they
    need (lowest `lo`, highest `upto`; None: to the head), taken as the read starts,
    and one future whose result (the span it left, None for an empty log) or error goes
    to all of them."""

    __slots__ = ("done", "lo", "upto")

    def __init__(self, lo: int, upto: int | None) -> None:
        self.lo, self.upto = lo, upto
        self.done: asyncio.Future[_Span | None] = asyncio.get_running_loop().create_future()
        self.done.add_done_callback(_retrieved)  # an error no waiter was left to take

    def want(self, lo: int, upto: int | None) -> None:
        self.lo = min(self.lo, lo)
        self.upto = None if upto is None or self.upto is None else max(self.upto, upto)


class TopicSpans:
    def __init__(
        self,
        reads: RecoveryReads,
        clock: Clock,
        limits: ResumeLimits,
        keep: Callable[[str], bool] = lambda topic: True,
    ) -> None:
        """`keep`: whether a topic's span is kept after the read (the gateway's own
        topics; another group's, read for a move, is read for the waiters and let go)."""
        self._keep = keep
        self._reads = reads
        self._clock = clock
        self._limits = limits
        self._spans: dict[str, _Span] = {}
        self._next: dict[str, _Flight] = {}  # topic -> the read its new waiters join
        self._flying: dict[str, asyncio.Future[_Span | None]] = {}  # the read under way
        self._tasks = Background("a topic's read", log)
        self._failed: dict[str, float] = {}  # topic -> when its last read failed
        # topic -> (start, upto, when): a read of (..., upto] ran out of budget at
        # `start`; any range from below it to `upto` or later is over, refused unread.
        self._cuts: dict[str, tuple[int, int, float]] = {}
        self.reads = 0  # budgeted reads that went to Redis
        self.read_bytes = 0  # bytes of log entries they brought
        self.failed_fast = 0  # reads refused: the topic's read failed a moment ago

    async def aclose(self) -> None:
        """Stop the reads under way or queued (at shutdown); their waiters are cancelled
        with them."""
        await self._tasks.cancel()
        # A read cancelled before its first step never ran: its waiters are told here.
        for flight in self._next.values():
            flight.done.cancel()
        self._next.clear()

    async def read(self, topic: str, after: int, upto: int | None) -> TopicHistory | None:
        """The batches with `after < seq <= upto`, in a history whose head is `upto`;
        upto None: to the log's head (or to the end of a span read in the last
        SPAN_TTL_S). None when the range is over the budget. RegistryUnavailable: the
        read failed (for every resume waiting on it), or did within FAIL_FAST_S."""
        lo = after if upto is None else start_of(after, upto)
        if upto is not None and lo == upto:
            return TopicHistory(upto)  # nothing after the position
        if upto is not None and (
            counter_of(upto) - counter_of(lo) > self._limits.max_entries  # from the head
            or self._cut_below(topic, lo, upto)
        ):
            return None
        span = self._spans.get(topic)
        if _covers(span, lo, upto, self._clock.monotonic()) is None:
            span = await self._join(topic, lo, upto)
        if span is None:  # an empty log: nothing to read
            return TopicHistory(upto if upto is not None else lo)
        hi = _covers(span, lo, upto, self._clock.monotonic(), fresh=True)
        if hi is None or counter_of(hi) - counter_of(lo) > self._limits.max_entries:
            return None  # ran out of budget above `lo` (or the log started again)
        span.used = self._clock.monotonic()
        return TopicHistory(hi, span.take(lo, hi)[0])

    def _cut_below(self, topic: str, lo: int, upto: int) -> bool:
        """Whether (lo, upto] reaches below where a read up to `upto` or before ran out
        of budget lately: it is over too (a log only grows at its head), and is refused
        without a read, once per topic per SPAN_TTL_S however many resumes try."""
        cut = self._cuts.get(topic)
        if cut is None or self._clock.monotonic() - cut[2] > SPAN_TTL_S:
            return False
        return _same_epoch(cut[1], upto) and lo < cut[0] and upto >= cut[1]

    def _cut(self, topic: str, got: TopicSpan, upto: int) -> None:
        now = self._clock.monotonic()
        self._cuts[topic] = (got.start, upto, now)
        if len(self._cuts) > 2 * MAX_SPANS:
            self._cuts = {t: c for t, c in self._cuts.items() if now - c[2] <= SPAN_TTL_S}

    async def _join(self, topic: str, lo: int, upto: int | None) -> _Span | None:
        """Wait for the next read of the topic (started if none is), widened to (lo,
        upto]; a waiter cancelled leaves it to the others."""
        now = self._clock.monotonic()
        if now - self._failed.get(topic, -FAIL_FAST_S) < FAIL_FAST_S:
            self.failed_fast += 1
            raise RegistryUnavailable(f"the log of {topic} did not answer a moment ago")
        flight = self._next.get(topic)
        if flight is None:
            flight = self._next[topic] = _Flight(lo, upto)
            self._tasks.spawn(self._fly(topic, flight))
        else:
            flight.want(lo, upto)
        return await asyncio.shield(flight.done)

    async def _fly(self, topic: str, flight: _Flight) -> None:
        done = flight.done
        try:
            ahead = self._flying.get(topic)
            if ahead is not None:
                await asyncio.wait([ahead])  # one read of a topic at a time
            if self._next.get(topic) is flight:
                del self._next[topic]  # its range is taken: later waiters start the next
            self._flying[topic] = done
            done.set_result(await self._read(topic, flight.lo, flight.upto))
        except RegistryUnavailable as exc:
            self._failed[topic] = self._clock.monotonic()
            done.set_exception(exc)
        except Exception as exc:
            done.set_exception(exc)
            raise
        except BaseException:
            done.cancel()
            raise
        finally:
            if self._next.get(topic) is flight:
                del self._next[topic]  # cancelled while it waited for the read ahead
            if self._flying.get(topic) is done:
                del self._flying[topic]
            if len(self._failed) > 2 * MAX_SPANS:
                now = self._clock.monotonic()
                self._failed = {t: w for t, w in self._failed.items() if now - w < FAIL_FAST_S}

    async def _read(self, topic: str, lo: int, upto: int | None) -> _Span | None:
        now = self._clock.monotonic()
        span = self._spans.get(topic)
        usable = (
            span is not None
            and now - span.used <= SPAN_TTL_S
            and _same_epoch(span.hi, lo if upto is None else upto)
        )
        if span is not None and usable and _covers(span, lo, upto, now) is not None:
            return span  # brought by the read before
        if span is not None and usable and span.lo <= lo <= span.hi:
            return await self._up(topic, span, lo, upto, now)
        if span is not None and usable and upto is not None and lo < span.lo <= upto <= span.hi:
            return await self._down(topic, span, lo, upto, now)
        return await self._fresh(topic, lo, upto, now)

    async def _up(
        self, topic: str, span: _Span, lo: int, upto: int | None, now: float
    ) -> _Span | None:
        """A range that starts inside the span: what it lacks above is read."""
        got = await self._fetch(topic, span.hi, upto)
        end = _end(span.hi, upto, got)
        if got.over or not _same_epoch(end, span.hi):
            return await self._fresh(topic, lo, upto, now, got)  # what fits, from the top
        span.add(got, span.hi, end)
        span.read_at = now
        span.trim(self._limits)
        self._fit()
        return span

    async def _down(self, topic: str, span: _Span, lo: int, upto: int, now: float) -> _Span | None:
        """A range that ends inside the span: what it lacks below is read (backward
        from the span's bottom, as much of it as fits the budget)."""
        bottom = span.lo  # one read of a topic at a time: the span stays as it was
        got = await self._fetch(topic, lo, bottom)
        if not _same_epoch(got.head, span.hi):
            return await self._fresh(topic, lo, upto, now)  # the log started again
        if got.over:
            self._cut(topic, got, bottom)
        span.add(got, got.start if got.over else lo, bottom)
        span.trim(self._limits)
        self._fit()
        return span

    async def _fresh(
        self, topic: str, lo: int, upto: int | None, now: float, got: TopicSpan | None = None
    ) -> _Span | None:
        """A range the span has nothing of: read, and kept as the topic's span (none for
        an empty log: a topic name the client chose keeps nothing)."""
        if got is None:
            got = await self._fetch(topic, lo, upto)
        end = _end(lo, upto, got)
        if not got.head:
            self._spans.pop(topic, None)
            return None
        if got.over:
            self._cut(topic, got, end)
            lo = got.start
        elif not lo or not _same_epoch(lo, end):
            lo = seq_of(epoch_of(end), 0)  # read from the log's start (it started again)
        span = _Span(lo, lo, now, now)
        span.add(got, lo, end)
        self._spans.pop(topic, None)
        if self._keep(topic):
            self._spans[topic] = span
            self._fit()
        return span

    def _fit(self) -> None:
        """Drop the least recently used spans past MAX_SPANS or SPANS_MAX_MEMORY."""
        spans = self._spans
        while len(spans) > 1 and (
            len(spans) > MAX_SPANS
            or IN_MEMORY * sum(span.cum[-1] for span in spans.values()) > SPANS_MAX_MEMORY
        ):
            del spans[min(spans, key=lambda t: spans[t].used)]

    async def _fetch(self, topic: str, after: int, upto: int | None) -> TopicSpan:
        """A read of (after, upto] within the budget, backward from `upto`: over it,
        the newest batches that fit (`over`, from `start`)."""
        lim = self._limits
        got = await self._reads.read_span(topic, after, upto, lim.max_entries, lim.max_bytes)
        self.reads += 1
        self.read_bytes += sum(got.sizes)
        return got


def _covers(
    span: _Span | None, lo: int, upto: int | None, now: float, fresh: bool = False
) -> int | None:
    """Where the span answers (lo, upto] up to: `upto`, or its top for None when read in
    the last SPAN_TTL_S (or `fresh`: just read for it); None when it does not."""
    if span is None or not span.lo <= lo <= span.hi:
        return None
    if not fresh and now - span.used > SPAN_TTL_S:
        return None  # unused too long: read again
    if upto is None:
        return span.hi if fresh or now - span.read_at < SPAN_TTL_S else None
    if upto > span.hi or not _same_epoch(span.hi, upto):
        return None
    return upto


def _retrieved(done: asyncio.Future[_Span | None]) -> None:
    if not done.cancelled():
        done.exception()


def _same_epoch(a: int, b: int) -> bool:
    return not a or not b or epoch_of(a) == epoch_of(b)


def _end(after: int, upto: int | None, got: TopicSpan) -> int:
    """Where a read of (after, upto] ended: `upto`, or the head it found (none: after)."""
    if upto is not None:
        return upto
    return got.head or after
