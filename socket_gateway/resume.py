"""A connection's replay: what it missed since its `pos` (or its inbox), then live.

Runs once per connection, right after its route is registered. Live pushes that reach
the connection meanwhile wait in `ClientConn.held` (from the moment it entered the
local map), and are written after the replay and its `recovered` frame; those the
replay already wrote are recognised by seq and not written twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace

from router.bus.base import BROADCAST, group_topic
from router.receipts.base import ACKED, DELIVERED, derives_ack
from router.recovery.base import OFFLINE_TOPIC, RecoveryLimits, RecoveryReads, TopicHistory
from router.recovery.replay import Replay, plan_replay
from shared.clock import Clock
from shared.coalesce import Coalescer
from shared.errors import RegistryUnavailable
from shared.models import Registration
from shared.positions import Pos, counter_of, decode_pos
from shared.tasks import Background
from shared.throttled import ThrottledLine
from shared.wire import push_prefix, recovered_frame
from socket_gateway.acks import Report, report_expired
from socket_gateway.connections import ClientConn, LocalConnections
from socket_gateway.fill_content import fill_for
from socket_gateway.gap_fill import GapFills
from socket_gateway.move_tail import MoveTails
from socket_gateway.resume_budget import ResumeLimits, credible_move, start_of
from socket_gateway.topic_spans import TopicSpans
from socket_gateway.ws.admission import ConnectRate

__all__ = ["ResumeStats", "Resumer"]

log = logging.getLogger(__name__)


class ResumeStats:
    __slots__ = ("complete", "expired", "incomplete", "limited", "moves_refused", "over",
                 "replayed", "resumes")  # fmt: skip

    def __init__(self, now: Callable[[], float]) -> None:
        self.resumes = 0  # connections that sent `since`
        self.replayed = 0  # push frames written by replays (inbox included)
        self.complete = 0
        self.incomplete = 0
        self.expired = 0  # left out: past their ttl_s
        # What the read budget (`socket_gateway.resume_budget`) turned down, each with
        # its throttled log line: resumes over their user's rate (the position not
        # read), topic logs over the budget, positions in a group they cannot be from.
        self.limited = ThrottledLine(
            log,
            "%(n)d resume(s) over IMROUTE_RECOVERY_RESUME_RATE_PER_UID for their user: "
            "topic logs not read (its own messages only, complete:false)",
            now=now,
        )
        self.over = _refused_line(_OVER, now)
        self.moves_refused = _refused_line(_NOT_FROM, now)


Recent = Callable[[str, int], tuple[int, TopicHistory] | None]


class Resumer:
    def __init__(
        self,
        reads: RecoveryReads,
        conns: LocalConnections,
        limits: RecoveryLimits,
        clock: Clock,
        recent: Recent | None = None,
        report: Report | None = None,
        move_tail_s: float = 0.0,
        budget: ResumeLimits | None = None,
    ) -> None:
        """`recent`: the follower's memory of its topics' latest batches, tried first.
        `report`: told of each push a replay or a gap fill wrote (its receipt), and of
        each a replay left out for its ttl_s (expired for this user).
        `move_tail_s`: how long a connection from another group reads that group's log
        again (`socket_gateway.move_tail`; 0: not at all). `budget`: what one resume may
        read (`socket_gateway.resume_budget`)."""
        self._report = report
        self._reads = reads
        self._conns = conns
        self._limits = limits
        self._clock = clock
        self._recent = recent
        self.budget = budget = budget or ResumeLimits()
        # Topic logs are read within the budget, shared by the resumes that need them.
        self.spans = TopicSpans(reads, clock, budget, self._own)
        self.tails = MoveTails(self.spans, reads, conns, clock, report, move_tail_s)
        rate = budget.rate_per_uid
        self._rate = ConnectRate(rate, budget.burst_per_uid) if rate else None
        # A storm of resumes asks Redis together: per-user reads and the acks of their
        # positions in pipelines, and one heads read for every resume that began before.
        self._read_users = Coalescer(reads.read_users)
        self._ack = Coalescer(reads.ack)
        # Those acks Redis did not take (in an outage, every resume's): the entries stay
        # in the inbox, and the next connection's position covers them.
        self._unacked_line = ThrottledLine(
            log,
            "could not ack the inbox entries the positions of %(n)d resume(s) covered "
            "(they stay in the inbox: the next connect's position covers them): %(exc)s",
            now=clock.monotonic,
        )
        self._heads: tuple[float, tuple[str, ...], asyncio.Future[list[int]]] | None = None
        self.stats = ResumeStats(clock.monotonic)
        # Each handles the store's errors itself: a failure logged here is a bug.
        self._gaps = Background("a gap fill or move tail", log)
        self.gap_fills = GapFills(self._read_users, conns, clock, report, self._gaps.spawn)

    def metrics(self) -> dict[str, tuple[str, float]]:
        """The resumes' counters for /metrics: name -> (help, value); with what the read
        budget (`socket_gateway.resume_budget`) turned down and the topic-log reads."""
        r, spans = self.stats, self.spans
        return {
            "resumes": ("Connections that asked to resume (since=)", r.resumes),
            "resumes_incomplete": ("Resumes answered complete:false", r.incomplete),
            "replayed_pushes": ("Push frames written by replays", r.replayed),
            "resumes_rate_limited": (
                "Resumes whose position was not read, over IMROUTE_RECOVERY_RESUME_RATE_PER_UID "
                "for their user (the inbox only, complete:false)",
                r.limited.total,
            ),
            "resume_topics_over_budget": (
                "Topic logs a resume did not read: its position was over "
                "IMROUTE_RECOVERY_RESUME_MAX batches or _MAX_BYTES behind the head",
                r.over.total,
            ),
            "resume_moves_refused": (
                "Resumes whose position named another group that no gateway of it could have "
                "given out lately: nothing of that group read (complete:false)",
                r.moves_refused.total,
            ),
            "resume_topic_reads": (
                "Topic-log reads resumes made in Redis (ranges held in memory not counted)",
                spans.reads,
            ),
            "resume_topic_read_bytes": (
                "Bytes of topic-log entries those reads brought",
                spans.read_bytes,
            ),
            "move_tails_stopped": (
                "Moved connections whose old group's log grew past the read budget: not "
                "followed further",
                self.tails.stopped.total,
            ),
        }

    def _own(self, topic: str) -> bool:
        """Whether `topic` is one this gateway follows (its spans are kept)."""
        group = self._conns.marks.group
        return topic in (BROADCAST, OFFLINE_TOPIC) or (bool(group) and topic == group_topic(group))

    @property
    def moved_tail_writes(self) -> int:
        """Pushes the old group's log brought after a move (`MoveTails.writes`)."""
        return self.tails.writes

    def attach(self, conn: ClientConn) -> None:
        """Called as the connection enters the local map: from now on live pushes wait
        for the replay, and it stands where the gateway's topics stand."""
        marks = self._conns.marks
        conn.b, conn.o, conn.g, conn.group = marks.b, marks.o, marks.g, marks.group
        conn.held = []

    async def resume(self, conn: ClientConn, since_text: str | None) -> None:
        """Replay, write `recovered`, then what waited. RegistryUnavailable: the store
        did not answer (the caller closes the connection; the client comes back)."""
        since = decode_pos(since_text)
        valid = since_text is None or since is not None
        replay, ends, since = await self._plan(conn, since, valid)
        if not conn.sink.is_open():
            return
        own_group, own_g = conn.group, conn.g
        if since is not None:
            conn.p, conn.b, conn.o, conn.group, conn.g = (
                since.p,
                since.b,
                since.o,
                since.group,
                since.g,
            )
        conns = self._conns
        report = self._report
        for item in replay.items:
            setattr(conn, item.log, item.seq)  # the log letters name ClientConn's fields
            prefix = item.prefix or push_prefix(item.message)
            push_id = item.message.push_id
            if not conns.write_push(conn, prefix, item.log, item.seq, push_id, True):
                return  # closed, or too slow to take its replay: it resumes from here later
            if report is not None:
                report(DELIVERED, push_id, (conn.uid,))
        _report_expired(report, replay, conn.uid)
        head_p, _, _, head_g = ends
        moved_from = _stand(conn, since, ends, own_group, own_g)
        if moved_from and self.tails.tail_s > 0:
            # What the replay wrote (the old group's log included), and what waited
            # (written below) and comes later: neither is written twice.
            conn.moved = {item.message.push_id for item in replay.items}
        replayed_p2p = {i.seq for i in replay.items if i.log == "p"}
        after = since.p if since is not None else head_p
        if replayed_p2p or after < head_p:
            conn.skip = (after, head_p, replayed_p2p)
        conns.write_frame(conn, recovered_frame(len(replay.items), replay.complete))
        self._count(replay, since_text is not None)
        self._conns.release(conn)
        covered = replay.inbox_covered
        furthest = max((e.seq for e in covered), default=0)
        if covered and report is not None:
            inbox_max = self._limits.inbox_max
            for e in covered:
                # A receipt that derives its acks from the position acked below needs none.
                if not derives_ack(e.message.push_id, e.seq, furthest, inbox_max):
                    report(ACKED, e.message.push_id, (conn.uid,))
        if conn.moved is not None:
            self._gaps.spawn(self.tails.follow(conn, moved_from, head_g))
        if covered:
            await self._ack_covered(conn.uid, furthest)

    async def aclose(self) -> None:
        """Stop the gap fills, move tails and log reads still running (at shutdown, once
        every connection is closed: what they would write has nobody to go to)."""
        await self._gaps.cancel()
        await self.spans.aclose()

    def fill_gap(self, conn: ClientConn, after: int, upto: int | None) -> None:
        """`GapFills.fill` (`LocalConnections.gap_filler`)."""
        self.gap_fills.fill(conn, after, upto)

    def catch_up(self, regs: Iterable[Registration] | None = None) -> int:
        """`GapFills.catch_up` (the heartbeat's, once Redis lost this gateway's routes)."""
        return self.gap_fills.catch_up(regs)

    @property
    def gap_filled(self) -> int:
        return self.gap_fills.filled

    async def _ack_covered(self, uid: str, seq: int) -> None:
        """The user's inbox acked up to `seq`, the furthest entry the position covered
        (coalesced)."""
        try:
            await self._ack((uid, seq))
        except RegistryUnavailable as exc:
            self._unacked_line.note(exc=exc)

    def _may_resume(self, uid: str) -> bool:
        """Whether `uid` is within its rate of resumes on this gateway (counted if not)."""
        if self._rate is None:
            return True
        now = self._clock.monotonic()
        if self._rate.take(uid, now) == 0.0:
            return True
        self.stats.limited.note()
        return False

    async def _plan(
        self, conn: ClientConn, since: Pos | None, valid: bool
    ) -> tuple[Replay, tuple[int, int, int, int], Pos | None]:
        """The replay, the heads it stands at, and where it starts: `since`, with each
        log it did not read at its head (a refused move: the connection's own group), so
        that the positions it writes do not name them again."""
        began = self._clock.monotonic()
        user = await self._read_users((conn.uid, since.p if since is not None else None))
        topics: dict[str, TopicHistory] = {}
        start = since
        if since is not None:
            wanted = [("b", BROADCAST, since.b), ("o", OFFLINE_TOPIC, since.o)]
            if since.group:
                wanted.append(("g", group_topic(since.group), since.g))
            # The heads first (one small read): a replay goes at least that far, so what
            # it leaves to the live path is newer than anything it sent.
            heads = await self._heads_since(began, tuple(topic for _, topic, _ in wanted))
            # Over its user's rate, the topic logs are not read (its own P2P log is,
            # bounded per user): each stands at its head, and the resume is incomplete.
            limited = not self._may_resume(conn.uid)
            for (letter, topic, after), head in zip(wanted, heads, strict=True):
                moved = letter == "g" and since.group != conn.group
                if moved and (limited or not credible_move(after, head, self.budget)):
                    if not limited:
                        self.stats.moves_refused.note()
                    valid = False  # nothing of that group is read, nor followed
                    start = replace(start or since, group=conn.group, g=conn.g)
                    continue
                history = None if limited else await self._topic(topic, after, head)
                if history is None:
                    if not limited:
                        self.stats.over.note()
                    history = TopicHistory(head)  # not read: a hole, so incomplete
                    start = _at(start or since, letter, head)
                topics[letter] = history
            topics = await fill_for(self._reads, conn.uid, topics)
        lim = self._limits
        replay = plan_replay(
            conn.uid,
            since,
            user,
            topics,
            self._clock.now_ms(),
            lim.window_ms,
            lim.inbox_ttl_ms,
            since_valid=valid,
        )
        ends = (
            user.head,
            topics["b"].head if "b" in topics else 0,
            topics["o"].head if "o" in topics else 0,
            topics["g"].head if "g" in topics else 0,
        )
        return replay, ends, start

    async def _heads_since(self, began: float, topics: tuple[str, ...]) -> list[int]:
        """The topics' heads, read after `began` (shared with resumes that asked too)."""
        shared = self._heads
        if shared is None or shared[0] < began or shared[1] != topics:
            future = asyncio.ensure_future(self._reads.heads(topics))
            shared = self._heads = (self._clock.monotonic(), topics, future)
        return await asyncio.shield(shared[2])

    async def _topic(self, topic: str, after: int, head: int) -> TopicHistory | None:
        """A topic's batches after `after`, through `head` at least: from the follower's
        memory for what it holds, the older and newer parts from the log (shared by the
        resumes that need them, within the budget); None when over the budget."""
        held = self._recent(topic, after) if self._recent is not None else None
        if held is None:
            return await self.spans.read(topic, after, head)
        start, mem = held
        if counter_of(head) - counter_of(start_of(after, head)) > self.budget.max_entries:
            return None  # decided from the head, as a read from the log is
        older = newer = None
        if start > after:
            older = await self.spans.read(topic, after, start)
            if older is None:
                return None
        if head > mem.head:
            newer = await self.spans.read(topic, mem.head, head)
            if newer is None:
                return None
        parts = [h.batches for h in (older, mem, newer) if h is not None]
        top = newer.head if newer is not None else mem.head
        return TopicHistory(top, [b for part in parts for b in part])

    def _count(self, replay: Replay, resumed: bool) -> None:
        s = self.stats
        s.replayed += len(replay.items)
        s.expired += replay.expired
        if resumed:
            s.resumes += 1
            if replay.complete:
                s.complete += 1
            else:
                s.incomplete += 1


_OVER = "too far behind its head (IMROUTE_RECOVERY_RESUME_MAX, _MAX_BYTES)"
_NOT_FROM = "in a group no gateway of it could have given out (the credible-move rule)"


def _refused_line(why: str, now: Callable[[], float]) -> ThrottledLine:
    """The line of topic logs a resume did not read, for `why`."""
    return ThrottledLine(
        log,
        f"%(n)d topic log(s) not read for resuming clients, their position {why}: complete:false",
        now=now,
    )


def _at(pos: Pos, letter: str, seq: int) -> Pos:
    """`pos` with its place in log `letter` (`b`, `o` or `g`) at `seq`."""
    if letter == "b":
        return replace(pos, b=seq)
    return replace(pos, o=seq) if letter == "o" else replace(pos, g=seq)


def _stand(
    conn: ClientConn, since: Pos | None, ends: tuple[int, int, int, int], group: str, g: int
) -> str:
    """After a replay, the connection stands at the heads it read, in its own `group`
    (where it stood at `g`); the group it came from, when another one."""
    head_p, head_b, head_o, head_g = ends
    conn.p = head_p
    if since is None:
        return ""
    conn.b, conn.o = head_b, head_o
    conn.group = group
    if since.group == group:
        conn.g = max(head_g, g)
        return ""
    conn.g = g
    return since.group


def _report_expired(report: Report | None, replay: Replay, uid: str) -> None:
    """The inbox's pushes a replay left out for their ttl_s (`report_expired`)."""
    if report is None:
        return
    for push_id in replay.expired_ids:
        report_expired(report, push_id, uid)
