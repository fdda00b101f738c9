"""The client's acks: which position an ack names, when it leaves, what the app holds,
and the task that sends them on each connection.

An ack frame, `{"type":"ack","pos":"<pos>"}`, is cumulative: it acknowledges every push
the connection received up to and including the one with that `pos`. A position names
nothing on the next connection, so the per-connection objects live for one connection.
In the order of this module:

- decided without I/O or a clock: which position an ack names (`AckTracker`), and when it
  may leave (`AckPacer`);
- with `auto_ack` off (pure too): the pushes handed to the app and not acked yet, by
  msg_id, and where each lives now (`Held`). A connection that ends while the app holds
  pushes sends them again on the next one (nothing acked them). The copy is a duplicate,
  not handed over again, but it takes the held push's place: the app's ack of the push
  it holds then acks the copy, on the connection that can still take it, and a duplicate
  of a held push is never acked on the app's behalf;
- one connection's acks on the wire (`ConnAcks`): a task that sends what `AckPacer` lets
  go, so the latest pending ack leaves within `interval_s` even while the app sits idle;
- the client's acks across its connections (`ClientAcks`): one `ConnAcks` for the
  current connection, and with `auto_ack` off what the app holds and the positions its
  acks reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Protocol

from websockets.exceptions import ConnectionClosed

from imroute_client.frames import Message
from imroute_client.stats import ClientStats

__all__ = [
    "MAX_HELD",
    "Ack",
    "AckPacer",
    "AckTracker",
    "ClientAcks",
    "ConnAcks",
    "Held",
    "Sender",
    "ack_frame",
]

log = logging.getLogger("imroute_client")

# Pushes remembered at most (the oldest are forgotten past it). A gateway remembers
# 512 unacked pushes per connection: an app that holds more gets them again anyway.
MAX_HELD = 1000
# How long a close waits to write the last ack before it closes anyway.
FLUSH_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Ack:
    """Acknowledge up to `pos`: `count` pushes that no earlier ack covered."""

    pos: str
    count: int


def ack_frame(pos: str) -> str:
    """The frame's text."""
    return json.dumps({"type": "ack", "pos": pos}, separators=(",", ":"))


class AckTracker:
    """One connection's pushes, numbered 1, 2, ... as they arrive (duplicates too), and
    how far acks cover them.

    The app acks the pushes it was handed. A duplicate the client dropped is done with as
    soon as it arrives, but acking it is cumulative: it is acked at once only when every
    push handed before it is acked, and otherwise with the app's ack of the last push
    handed before it. So a dropped duplicate never stays unacked (and sent again on every
    connect) for want of a later push, and no ack covers a push the app still holds.
    """

    __slots__ = ("acked", "covered", "handed", "last_pos", "received")

    def __init__(self) -> None:
        self.received = 0  # pushes that arrived
        self.handed = 0  # the number of the last one handed to the app
        self.acked = 0  # the last one the app acked
        self.covered = 0  # the last one an ack (sent or pending) names
        self.last_pos: str | None = None  # the pos of push number `received`

    def message(self, pos: str | None) -> int:
        """A push handed to the app: its number on this connection."""
        self.received += 1
        self.handed = self.received
        self.last_pos = pos
        return self.received

    def duplicate(self, pos: str | None) -> Ack | None:
        """A push dropped as a duplicate: the ack to send, if it may go now."""
        self.received += 1
        self.last_pos = pos
        if self.acked < self.handed:
            return None  # the app still holds an earlier push
        return self._cover(self.received, pos)

    def ack(self, number: int, pos: str | None) -> Ack | None:
        """The app is done with push `number` (whose pos is `pos`) and all before it."""
        if number <= self.acked:
            return None  # an older ack than one already made: covered
        if number > self.handed:
            raise ValueError(f"push {number} was not handed out (the last was {self.handed})")
        self.acked = number
        if number == self.handed and self.last_pos is not None:
            # The duplicates that came after it go with it.
            return self._cover(self.received, self.last_pos)
        return self._cover(number, pos)

    def _cover(self, number: int, pos: str | None) -> Ack | None:
        if pos is None or number <= self.covered:
            return None  # a server that sends no pos takes no acks
        count, self.covered = number - self.covered, number
        return Ack(pos, count)


class AckPacer:
    """At most one ack frame per `interval_s`: the first goes at once, later ones wait
    for the interval, merged into the latest (acks are cumulative). Times are the
    caller's monotonic seconds."""

    __slots__ = ("_last_sent", "_pending", "interval_s")

    def __init__(self, interval_s: float) -> None:
        if interval_s < 0:
            raise ValueError(f"ack interval {interval_s} is negative")
        self.interval_s = interval_s
        self._pending: Ack | None = None
        self._last_sent: float | None = None

    @property
    def pending(self) -> Ack | None:
        """The ack waiting to leave."""
        return self._pending

    def offer(self, ack: Ack) -> bool:
        """Make `ack` the one to send next; True when none was waiting (so a sender
        asleep with nothing to do must wake)."""
        was = self._pending
        self._pending = ack if was is None else Ack(ack.pos, was.count + ack.count)
        return was is None

    def due(self) -> float | None:
        """When the waiting ack may leave (None: none waits)."""
        if self._pending is None:
            return None
        if self._last_sent is None:
            return float("-inf")
        return self._last_sent + self.interval_s

    def poll(self, now: float) -> Ack | None:
        """The ack to send at `now`, if one waits and the interval has passed."""
        due = self.due()
        if due is None or now < due:
            return None
        ack, self._pending, self._last_sent = self._pending, None, now
        return ack

    def take(self) -> Ack | None:
        """The waiting ack whatever the pace (the connection is closing), or None."""
        ack, self._pending = self._pending, None
        return ack


class Held:
    """msg_id -> the push as it lives now (its `conn` and `number`), oldest first."""

    __slots__ = ("_by_id", "size")

    def __init__(self, size: int = MAX_HELD) -> None:
        if size < 1:
            raise ValueError(f"held size {size} is below 1")
        self.size = size
        self._by_id: OrderedDict[str, Message] = OrderedDict()

    def handed(self, msg: Message) -> bool:
        """`msg` was handed to the app; True when the oldest held one was forgotten for
        it (a copy of that one will be acked as any duplicate)."""
        self._by_id[msg.msg_id] = msg
        if len(self._by_id) <= self.size:
            return False
        self._by_id.popitem(last=False)
        return True

    def home(self, msg_id: str) -> Message | None:
        """The held push `msg_id` as it lives now, or None when it is not held."""
        return self._by_id.get(msg_id)

    def moved(self, copy: Message) -> bool:
        """A duplicate arrived: if its push is held, the copy takes its place (True)."""
        if copy.msg_id not in self._by_id:
            return False
        self._by_id[copy.msg_id] = copy
        return True

    def acked(self, conn: int, number: int) -> None:
        """Every push held at (`conn`, 1..`number`) is done with: forget it."""
        done = [k for k, m in self._by_id.items() if m.conn == conn and m.number <= number]
        for k in done:
            del self._by_id[k]

    def __len__(self) -> int:
        return len(self._by_id)


class Sender(Protocol):
    """The connection's write side (`websockets`' ClientConnection)."""

    async def send(self, message: str) -> None: ...


class ConnAcks:
    """The acks of connection `conn_id` (the client's count of its connections)."""

    def __init__(self, ws: Sender, conn_id: int, interval_s: float, stats: ClientStats) -> None:
        self.conn_id = conn_id
        self.tracker = AckTracker()
        self._ws = ws
        self._pacer = AckPacer(interval_s)
        self._stats = stats
        self._sent = 0  # pushes that acks sent on this connection covered
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"imroute-acks-{conn_id}")

    def message(self, pos: str | None) -> int:
        """A push handed to the app: its number on this connection."""
        return self.tracker.message(pos)

    def duplicate(self, pos: str | None) -> Ack | None:
        """A push dropped as a duplicate: the ack, if it is acked now (nothing before it
        is held)."""
        return self._offer(self.tracker.duplicate(pos))

    def ack(self, number: int, pos: str | None) -> Ack | None:
        """The app is done with push `number` and every one before it: the ack, if this
        covers something new."""
        return self._offer(self.tracker.ack(number, pos))

    async def close(self, *, flush: bool) -> None:
        """Stop; with `flush`, write the pending ack first (the connection is still
        open). What no ack covered is counted: the server sends it again."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        ack = self._pacer.take()
        if flush and ack is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._send(ack), FLUSH_TIMEOUT_S)
        unacked = self.tracker.received - self._sent
        if unacked:
            self._stats.unacked_at_close += unacked
            log.info("connection %d closed with %d push(es) unacked: the server sends them "
                     "again", self.conn_id, unacked)  # fmt: skip

    def _offer(self, ack: Ack | None) -> Ack | None:
        if ack is not None and self._pacer.offer(ack):
            self._wake.set()
        return ack

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            ack = self._pacer.poll(loop.time())
            if ack is not None:
                if not await self._send(ack):
                    return
                continue
            due = self._pacer.due()
            self._wake.clear()
            if due is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, due - loop.time()))

    async def _send(self, ack: Ack) -> bool:
        """Write one ack frame; False when the connection is gone (its reader sees why)."""
        try:
            await self._ws.send(ack_frame(ack.pos))
        except ConnectionClosed:
            return False
        self._sent += ack.count
        self._stats.acks_sent += 1
        self._stats.acked += ack.count
        return True


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
        self._stats = stats
        self._conn: ConnAcks | None = None
        self._held = Held()

    def connected(self, ws: Sender, conn_id: int) -> None:
        """A new connection; acks name only its pushes."""
        self._conn = ConnAcks(ws, conn_id, self.interval_s, self._stats)

    async def lost(self, *, flush: bool) -> None:
        """The connection ended (or is closing, `flush`: send the pending ack first)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        await conn.close(flush=flush)

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
