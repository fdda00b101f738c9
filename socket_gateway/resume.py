"""A connection's replay: what it missed since its `pos` (or its inbox), then live.

Runs once per connection, right after its route is registered. Live pushes that reach
the connection meanwhile wait in `ClientConn.held` (from the moment it entered the
local map), and are written after the replay and its `recovered` frame; those the
replay already wrote are recognised by seq and not written twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from router.bus.base import BROADCAST, group_topic
from router.receipts.base import ACKED, DELIVERED
from router.recovery.base import OFFLINE_TOPIC, RecoveryLimits, RecoveryReads, TopicHistory
from router.recovery.replay import Replay, plan_replay
from shared.clock import Clock
from shared.coalesce import Coalescer
from shared.errors import RegistryUnavailable
from shared.positions import Pos, decode_pos
from shared.wire import push_prefix, recovered_frame
from socket_gateway.connections import ClientConn, LocalConnections

__all__ = ["ResumeStats", "Resumer"]

log = logging.getLogger(__name__)


class ResumeStats:
    __slots__ = ("complete", "expired", "incomplete", "replayed", "resumes")

    def __init__(self) -> None:
        self.resumes = 0  # connections that sent `since`
        self.replayed = 0  # push frames written by replays (inbox included)
        self.complete = 0
        self.incomplete = 0
        self.expired = 0  # left out: past their ttl_s


# A connection that resumed from another group reads that group's log again this long
# after its move, at doubling intervals from the first (`Resumer.move_tail_s`).
MOVE_TAIL_FIRST_S = 0.5

# A topic read is shared for this long by the resumes that ask for the same range (a
# storm of clients from one gateway): correct however old, since the replay then stands
# at the head it read, and the follower brings what came after.
SHARED_READ_S = 1.0

Recent = Callable[[str, int], TopicHistory | None]
# (state, push_id, uids): `socket_gateway.acks.AckReporter.report`.
Report = Callable[[str, str, Sequence[str]], None]


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
    ) -> None:
        """`recent`: the follower's memory of its topics' latest batches, tried first.
        `report`: told of each push a replay or a gap fill wrote (its receipt).
        `move_tail_s`: how long a connection from another group reads that group's log
        again (`_tail_old_group`; 0: not at all)."""
        self.move_tail_s = move_tail_s
        self.moved_tail_writes = 0  # pushes the old group's log brought after a move
        self._report = report
        self._reads = reads
        self._conns = conns
        self._limits = limits
        self._clock = clock
        self._recent = recent
        self._shared: dict[tuple[str, int], tuple[float, asyncio.Future[TopicHistory]]] = {}
        # A storm of resumes asks Redis together: per-user reads and inbox clean-ups in
        # pipelines, and one heads read for every resume that began before it did.
        self._read_users = Coalescer(reads.read_users)
        self._forget = Coalescer(reads.forget_inboxes)
        self._heads: tuple[float, tuple[str, ...], asyncio.Future[list[int]]] | None = None
        self.stats = ResumeStats()
        self.topic_reads = 0  # batch-log reads that went to the store
        self._gaps: set[asyncio.Future[None]] = set()
        self.gaps = 0  # holes in a live connection's P2P sequence, read from the log
        self.gap_filled = 0  # pushes those reads wrote

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
        replay, ends = await self._plan(conn, since, valid)
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
        head_p, _, _, head_g = ends
        moved_from = _stand(conn, since, ends, own_group, own_g)
        if moved_from and self.move_tail_s > 0:
            conn.moved = set()  # from what waited (written below) on
        replayed_p2p = {i.seq for i in replay.items if i.log == "p"}
        after = since.p if since is not None else head_p
        if replayed_p2p or after < head_p:
            conn.skip = (after, head_p, replayed_p2p)
        conns.write_frame(conn, recovered_frame(len(replay.items), replay.complete))
        self._count(replay, since_text is not None)
        self._conns.release(conn)
        covered = replay.inbox_covered
        if covered and report is not None:
            for e in covered:
                report(ACKED, e.message.push_id, (conn.uid,))
        if conn.moved is not None:
            self._spawn(self._tail_old_group(conn, moved_from, head_g))
        gone = [*replay.inbox_gone, *(e.seq for e in covered)]
        if gone:
            await self._forget_gone(conn.uid, gone)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background, kept until it ends (gap fills, move tails)."""
        task = asyncio.ensure_future(work)
        self._gaps.add(task)
        task.add_done_callback(self._gaps.discard)

    async def _tail_old_group(self, conn: ClientConn, group: str, after: int) -> None:
        """The seam of a move between groups: a multicast resolved to the user's old route
        (a gateway of `group`, perhaps dead, not yet out of the fleet) lands in that
        group's log, perhaps after the replay read it, and no gateway of the new group
        brings it: the old log is read again for `move_tail_s`, and what names the user
        and did not reach it through its new group is written."""
        try:
            await self._tail(conn, group, after)
        finally:
            conn.moved = None

    async def _tail(self, conn: ClientConn, group: str, after: int) -> None:
        topic = group_topic(group)
        delay, waited = MOVE_TAIL_FIRST_S, 0.0
        while waited < self.move_tail_s and conn.sink.is_open():
            step = min(delay, self.move_tail_s - waited)
            await asyncio.sleep(step)
            waited += step
            delay *= 2
            try:
                history = await self._shared_read(topic, after, after)
            except RegistryUnavailable as exc:
                log.warning("could not read the log of a client's old group: %s", exc)
                continue
            if not conn.sink.is_open():
                return
            now = self._clock.now_ms()
            had = conn.moved if conn.moved is not None else set()
            for logged in history.batches:
                if logged.seq <= after:
                    continue
                after = logged.seq
                expires_ms = logged.batch.expires_ms
                push_id = logged.message.push_id
                if not logged.addresses(conn.uid) or push_id in had:
                    continue
                if expires_ms and now > expires_ms:
                    continue
                if self._conns.write_push(conn, logged.prefix, "g", 0, push_id, False):
                    self.moved_tail_writes += 1
                    if self._report is not None:
                        self._report(DELIVERED, push_id, (conn.uid,))

    def fill_gap(self, conn: ClientConn, after: int, upto: int | None) -> None:
        """A hole (after, upto] in a live connection's P2P sequence (None: to the log's
        head): write what the log holds of it, in order, then what waited behind it
        (`LocalConnections.gap_filler`). The connection's live pushes wait meanwhile."""
        if conn.held is None:
            conn.held = []
        self._spawn(self._fill_gap(conn, after, upto))

    def catch_up(self) -> int:
        """Every live connection reads what its user's log and inbox hold past what it
        was written: after Redis lost this gateway's routes (a restart, a long partition)
        pushes to its users were queued, and a user who gets no later push would wait
        for a reconnect. How many connections were asked to."""
        started = 0
        for conn in list(self._conns):
            if conn.held is None and conn.sink.is_open():  # replaying: it reads them anyway
                self.fill_gap(conn, conn.p, None)
                started += 1
        return started

    async def _fill_gap(self, conn: ClientConn, after: int, upto: int | None) -> None:
        self.gaps += 1
        try:
            user = await self._read_users((conn.uid, after))
        except RegistryUnavailable as exc:
            log.warning("could not read a hole in a connection's messages: %s", exc)
            user = None
        if upto is None:
            upto = user.head if user is not None else after
        conns = self._conns
        report = self._report
        wrote: list[int] = []
        if user is not None and conn.sink.is_open():
            now = self._clock.now_ms()
            skip = conn.skip
            # The inbox too: what no device acked may be older than the log's window.
            held = {e.seq: e for e in (*user.inbox, *user.log)}
            for e in (held[seq] for seq in sorted(held)):
                if not after < e.seq <= upto or (skip is not None and e.seq in skip[2]):
                    continue
                if e.expires_ms and now > e.expires_ms:
                    continue
                conn.p = e.seq
                push_id = e.message.push_id
                if conns.write_push(conn, push_prefix(e.message), "p", e.seq, push_id, False):
                    wrote.append(e.seq)
                    if report is not None:
                        report(DELIVERED, push_id, (conn.uid,))
        # What the log no longer holds is past the window or its ttl_s: passed over.
        conn.p = max(conn.p, upto)
        if wrote:
            if conn.skip is None:
                conn.skip = (0, 0, set())
            conn.skip[2].update(wrote)
            self.gap_filled += len(wrote)
        conns.release(conn)

    async def _forget_gone(self, uid: str, seqs: list[int]) -> None:
        """Take inbox entries past their ttl_s or the inbox TTL, or that the position
        acked, out (coalesced)."""
        try:
            await self._forget((uid, seqs))
        except RegistryUnavailable as exc:
            # They stay in the inbox, and every replay leaves them out again.
            log.warning("could not take expired entries out of an inbox: %s", exc)

    async def _plan(
        self, conn: ClientConn, since: Pos | None, valid: bool
    ) -> tuple[Replay, tuple[int, int, int, int]]:
        began = self._clock.monotonic()
        user = await self._read_users((conn.uid, since.p if since is not None else None))
        topics: dict[str, TopicHistory] = {}
        if since is not None:
            wanted = [("b", BROADCAST, since.b), ("o", OFFLINE_TOPIC, since.o)]
            if since.group:
                wanted.append(("g", group_topic(since.group), since.g))
            # The heads first (one small read): a replay goes at least that far, so what
            # it leaves to the live path is newer than anything it sent.
            heads = await self._heads_since(began, tuple(topic for _, topic, _ in wanted))
            for (letter, topic, after), head in zip(wanted, heads, strict=True):
                topics[letter] = await self._topic(topic, after, head)
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
        return replay, ends

    async def _heads_since(self, began: float, topics: tuple[str, ...]) -> list[int]:
        """The topics' heads, read after `began` (shared with resumes that asked too)."""
        shared = self._heads
        if shared is None or shared[0] < began or shared[1] != topics:
            future = asyncio.ensure_future(self._reads.heads(topics))
            shared = self._heads = (self._clock.monotonic(), topics, future)
        return await asyncio.shield(shared[2])

    async def _topic(self, topic: str, after: int, head: int) -> TopicHistory:
        """A topic's batches after `after`, through `head` at least: from the follower's
        memory as far as it goes, the rest from the log (shared by concurrent resumes)."""
        held = self._recent(topic, after) if self._recent is not None else None
        if held is None:
            return await self._shared_read(topic, after, head)
        if held.head >= head:
            return held
        tail = await self._shared_read(topic, held.head, head)
        return TopicHistory(tail.head, [*held.batches, *tail.batches])

    async def _shared_read(self, topic: str, after: int, head: int) -> TopicHistory:
        now = self._clock.monotonic()
        key = (topic, after)
        shared = self._shared.get(key)
        if shared is not None and shared[0] >= now:
            try:
                history = await asyncio.shield(shared[1])
            except RegistryUnavailable:
                history = None
            if history is not None and history.head >= head:
                return history
        if len(self._shared) > 1000:
            self._shared = {k: v for k, v in self._shared.items() if v[0] >= now}
        future = asyncio.ensure_future(self._reads.read_topic(topic, after))
        self.topic_reads += 1
        self._shared[key] = (now + SHARED_READ_S, future)
        return await asyncio.shield(future)

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
