"""The seam of a move between groups, watched for a while after the replay.

A multicast resolved to a user's old route (a gateway of the group it just left, perhaps
dead, not yet out of the fleet) lands in that group's log, perhaps after the replay read
it, and no gateway of the new group brings it. So a connection that resumed from
another group reads that group's log again at 0.5, 1, 2, 4, 8 s ... for `tail_s`, and
is written what names its user and did not reach it through its new group, once.

Each read is one of the resume's (`TopicSpans`: shared by range, within the budget): a
group whose log grows past the budget between two reads is not followed further (the
tail stops, counted and logged), so a move costs no more than a resume does.
"""

from __future__ import annotations

import asyncio
import logging

from router.bus.base import group_topic
from router.receipts.base import DELIVERED
from router.recovery.base import RecoveryReads, TopicHistory
from shared.backoff import backoff_s
from shared.clock import Clock
from shared.errors import RegistryUnavailable
from shared.throttled import ThrottledLine
from socket_gateway.acks import Report
from socket_gateway.connections import ClientConn, LocalConnections
from socket_gateway.fill_content import fill_for
from socket_gateway.topic_spans import TopicSpans

__all__ = ["MOVE_TAIL_FIRST_S", "MoveTails"]

log = logging.getLogger(__name__)

# The first read of the old group's log this long after the replay; then at doubling
# intervals, for `MoveTails.tail_s` in all.
MOVE_TAIL_FIRST_S = 0.5


class MoveTails:
    def __init__(
        self,
        spans: TopicSpans,
        reads: RecoveryReads,
        conns: LocalConnections,
        clock: Clock,
        report: Report | None,
        tail_s: float,
    ) -> None:
        """`tail_s`: how long the old group's log is read again (0: not at all)."""
        self.tail_s = tail_s
        self.writes = 0  # pushes the old group's log brought after a move
        # Tails given up: the log grew past the read budget
        self.stopped = ThrottledLine(
            log,
            "stopped following the old group's log of %(n)d moved client(s): it grew past "
            "IMROUTE_RECOVERY_RESUME_MAX or _MAX_BYTES",
            now=clock.monotonic,
        )
        self._spans = spans
        self._reads = reads
        self._conns = conns
        self._clock = clock
        self._report = report

    async def follow(self, conn: ClientConn, group: str, after: int) -> None:
        """Read `group`'s log after `after` for `tail_s`; `conn.moved` is None after."""
        try:
            await self._tail(conn, group, after)
        finally:
            conn.moved = None

    async def _tail(self, conn: ClientConn, group: str, after: int) -> None:
        topic = group_topic(group)
        reads, waited = 0, 0.0
        while waited < self.tail_s and conn.sink.is_open():
            reads += 1
            step = backoff_s(reads, MOVE_TAIL_FIRST_S, self.tail_s - waited, rand=None)
            await asyncio.sleep(step)
            waited += step
            try:
                history = await self._spans.read(topic, after, None)
                if history is None:
                    self.stopped.note()
                    return
                mine = [b for b in history.batches if b.seq > after and b.addresses(conn.uid)]
                after = max(after, history.head)
                if mine:
                    filled = await fill_for(self._reads, conn.uid, {"g": TopicHistory(0, mine)})
                    self._write(conn, filled["g"])
            except RegistryUnavailable as exc:
                log.warning("could not read the log of a client's old group: %s", exc)

    def _write(self, conn: ClientConn, mine: TopicHistory) -> None:
        if not conn.sink.is_open():
            return
        now = self._clock.now_ms()
        had = conn.moved if conn.moved is not None else set()
        for logged in mine.batches:
            push_id = logged.message.push_id
            expires_ms = logged.batch.expires_ms
            if push_id in had or (expires_ms and now > expires_ms):
                continue
            if self._conns.write_push(conn, logged.prefix, "g", 0, push_id, False):
                self.writes += 1
                if self._report is not None:
                    self._report(DELIVERED, push_id, (conn.uid,))
