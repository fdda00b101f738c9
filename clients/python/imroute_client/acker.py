"""The client's acks across its connections: one `ConnAcks` for the current connection,
and with `auto_ack` off what the app holds (`Held`) and the positions its acks reach."""

from __future__ import annotations

import logging
from dataclasses import replace

from imroute_client.acking import ConnAcks, Sender
from imroute_client.frames import Message
from imroute_client.held import Held
from imroute_client.policy import refuses_acks
from imroute_client.stats import ClientStats

__all__ = ["ClientAcks"]

log = logging.getLogger("imroute_client")


class ClientAcks:
    """Numbers each push on its connection and acks what the app is done with.

    With `auto` the client calls `ack` for the app (when it asks for the next push) and
    keeps saving positions as it always did. Without, only the app acks, and the position
    to save is the one its last ack reached: a resume's `since` acks what it covers on
    the server, so it must not run ahead of the app.
    """

    def __init__(self, auto: bool, interval_s: float, stats: ClientStats) -> None:
        if interval_s < 0:
            raise ValueError(f"ack_interval_s {interval_s} is negative")
        self.auto = auto
        self.interval_s = interval_s
        self.off = False  # a gateway refused an ack frame (one older than acks)
        self._stats = stats
        self._conn: ConnAcks | None = None
        self._held = Held()

    def connected(self, ws: Sender, conn_id: int) -> None:
        """A new connection; acks name only its pushes."""
        sender = None if self.off else ws
        self._conn = ConnAcks(sender, conn_id, self.interval_s, self._stats)

    async def lost(self, code: int | None = None, reason: str = "", *, flush: bool) -> None:
        """The connection ended (or is closing, `flush`: send the pending ack first)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        await conn.close(flush=flush)
        if conn.sent_any and refuses_acks(code, reason):
            self.off = True
            self._stats.acks_refused += 1
            log.warning("the gateway takes no ack frames (close 1008: %s): acks are off", reason)

    def push(self, frame: Message) -> Message:
        """A push to hand to the app: numbered on its connection."""
        conn = self._conn
        assert conn is not None, "a push without a connection"
        msg = replace(frame, conn=conn.conn_id, number=conn.message(frame.pos))
        if not self.auto and self._held.handed(msg):
            self._stats.held_forgotten += 1
            if self._stats.held_forgotten == 1:
                log.warning("the app holds over %d unacked pushes: the oldest are forgotten "
                            "(a copy of one is acked)", self._held.size)  # fmt: skip
        return msg

    def duplicate(self, frame: Message) -> str | None:
        """A push dropped as a duplicate: the position to save, if any."""
        conn = self._conn
        assert conn is not None, "a push without a connection"
        if not self.auto and self._held.home(frame.msg_id) is not None:
            # The app holds it (from an ended connection): the copy stands in for it.
            number = conn.message(frame.pos)
            self._held.moved(replace(frame, conn=conn.conn_id, number=number))
            return None
        ack = conn.duplicate(frame.pos)
        if self.auto:
            return frame.pos  # nothing is held: it is processed
        return ack.pos if ack is not None else None

    def ack(self, message: Message) -> str | None:
        """The app is done with `message` and all before it: the position to save."""
        home = message
        if not self.auto:
            home = self._held.home(message.msg_id) or message
            self._held.acked(message.conn, message.number)
            self._held.acked(home.conn, home.number)
        conn = self._conn
        if conn is None or home.conn != conn.conn_id or not home.number:
            return None  # its connection ended: acked when it comes again
        ack = conn.ack(home.number, home.pos)
        return ack.pos if ack is not None and not self.auto else None
