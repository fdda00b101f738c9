"""Client acks, decided without I/O or a clock: which position an ack names
(`AckTracker`), and when it may leave (`AckPacer`).

An ack frame, `{"type":"ack","pos":"<pos>"}`, is cumulative: it acknowledges every push
the connection received up to and including the one with that `pos`. Both objects live
for one connection: a position names nothing on the next one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["Ack", "AckPacer", "AckTracker", "ack_frame"]


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
