"""A bounded window of the msg_ids seen last, to drop duplicates."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["DedupeWindow"]


class DedupeWindow:
    """The last `size` distinct msg_ids (least recently seen leave first); 0 keeps none."""

    __slots__ = ("_ids", "size")

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"dedupe window {size} is negative")
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def seen(self, msg_id: str) -> bool:
        """Whether `msg_id` is in the window; it is (re)entered as the newest either way."""
        if msg_id in self._ids:
            self._ids.move_to_end(msg_id)
            return True
        if self.size:
            self._ids[msg_id] = None
            if len(self._ids) > self.size:
                self._ids.popitem(last=False)
        return False

    def __len__(self) -> int:
        return len(self._ids)
