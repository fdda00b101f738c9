"""What the gateway writes to, in memory, for the unit tests of its delivery."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ListSink"]


@dataclass
class ListSink:
    """A connection's socket in memory: the frames written to it, and its state."""

    frames: list[bytes] = field(default_factory=list)
    open: bool = True
    backlog: int = 0
    aborted: bool = False

    def is_open(self) -> bool:
        return self.open

    def buffered(self) -> int:
        return self.backlog

    def write(self, data: bytes) -> None:
        self.frames.append(data)

    def abort(self) -> None:
        self.aborted = True
