"""Holes in a live connection's P2P sequence, read from its user's log and inbox.

A live connection's P2P pushes come in sequence (`LocalConnections`): a hole (a push
that failed for it, or one overtaken by the next) is read and written before what
follows, which waits meanwhile; after Redis lost the gateway's routes every live
connection reads what its user's log and inbox hold past what it was written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from router.receipts.base import DELIVERED
from router.recovery.base import UserHistory
from shared.clock import Clock
from shared.errors import RegistryUnavailable
from shared.models import Registration
from shared.wire import push_prefix
from socket_gateway.acks import Report, report_expired
from socket_gateway.connections import ClientConn, LocalConnections

__all__ = ["GapFills"]

log = logging.getLogger(__name__)

# (uid, after) -> the user's log after it and inbox: `Resumer`'s coalesced read.
ReadUser = Callable[[tuple[str, int | None]], Coroutine[Any, Any, UserHistory]]
Spawn = Callable[[Coroutine[Any, Any, None]], object]


@dataclass(slots=True, eq=False)
class GapFills:
    read_user: ReadUser
    conns: LocalConnections
    clock: Clock
    report: Report | None
    spawn: Spawn
    # Holes in a live connection's P2P sequence, read from the log; pushes those reads wrote.
    gaps: int = field(default=0, init=False)
    filled: int = field(default=0, init=False)

    def fill(self, conn: ClientConn, after: int, upto: int | None) -> None:
        """A hole (after, upto] in a live connection's P2P sequence (None: to the log's
        head): write what the log holds of it, in order, then what waited behind it
        (`LocalConnections.gap_filler`). The connection's live pushes wait meanwhile."""
        if conn.held is None:
            conn.held = []
        self.spawn(self._fill(conn, after, upto))

    def catch_up(self, regs: Iterable[Registration] | None = None) -> int:
        """Every live connection (those of `regs`, when given) reads what its user's log
        and inbox hold past what it was written: after Redis lost this gateway's routes
        (a restart, a shard restarted empty, a long partition) pushes to its users were
        queued, and a user who gets no later push would wait for a reconnect. How many
        connections were asked to."""
        started = 0
        for conn in list(self.conns) if regs is None else self.conns.of(regs):
            if conn.held is None and conn.sink.is_open():  # replaying: it reads them anyway
                self.fill(conn, conn.p, None)
                started += 1
        return started

    async def _fill(self, conn: ClientConn, after: int, upto: int | None) -> None:
        self.gaps += 1
        try:
            user = await self.read_user((conn.uid, after))
        except RegistryUnavailable as exc:
            # Passed over (what waits behind it was answered delivered: it is written),
            # but never acked by this connection: its acks stop before the hole, which
            # stays in the user's inbox for the next connection (an ack covers all before
            # it).
            log.warning("could not read a hole in a connection's messages: %s", exc)
            user = None
            conn.ack_cap = after if conn.ack_cap is None else min(conn.ack_cap, after)
        if upto is None:
            upto = user.head if user is not None else after
        conns = self.conns
        report = self.report
        wrote: list[int] = []
        if user is not None and conn.sink.is_open():
            now = self.clock.now_ms()
            skip = conn.skip
            # The inbox too: what no device acked may be older than the log's window.
            held = {e.seq: e for e in (*user.inbox, *user.log)}
            waiting = {e.seq for e in user.inbox}
            for e in (held[seq] for seq in sorted(held)):
                if not after < e.seq <= upto or (skip is not None and e.seq in skip[2]):
                    continue
                if e.expires_ms and now > e.expires_ms:
                    # Never written (as a replay's left out: `report_expired`).
                    if report is not None and e.seq in waiting:
                        report_expired(report, e.message.push_id, conn.uid)
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
            self.filled += len(wrote)
        conns.release(conn)
