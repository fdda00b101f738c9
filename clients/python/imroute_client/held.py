"""With `auto_ack` off: the pushes handed to the app and not acked yet, by msg_id, and
where each lives now (pure).

A connection that ends while the app holds pushes sends them again on the next one
(nothing acked them). The copy is a duplicate, not handed over again, but it takes the
held push's place: the app's ack of the push it holds then acks the copy, on the
connection that can still take it, and a duplicate of a held push is never acked on the
app's behalf.
"""

from __future__ import annotations

from collections import OrderedDict

from imroute_client.frames import Message

__all__ = ["MAX_HELD", "Held"]

# Pushes remembered at most (the oldest are forgotten past it). A gateway remembers
# 128 unacked pushes per connection: an app that holds more gets them again anyway.
MAX_HELD = 1000


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
