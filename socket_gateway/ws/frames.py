"""Client frames read without the WebSocket library, where that is safe (pure).

A client's frames are mostly acks: small text frames, a few dozen bytes each. The
library (websockets' sans-I/O protocol) parses every frame through a chain of
generators, which cost a gateway more per ack than writing the push it acks. A read
that holds nothing but whole, small, final, masked text frames, starting where a frame
starts, is read here instead (`small_texts`); anything else (a ping, a close, a binary
or fragmented frame, a frame split across reads, bad UTF-8, an unmasked frame) goes to
the library as before, which keeps every rule and close code it applies.

Whether a read starts where a frame starts is known by following the frame boundaries
through every read the library parses (`FrameEnds`): the frame phase begins on a fresh
protocol, at a boundary.
"""

from __future__ import annotations

try:  # the library's C version, as its own frame parser uses
    from websockets.speedups import apply_mask
except ImportError:  # built without its C extension
    from websockets.utils import apply_mask

__all__ = ["SMALL_MAX", "FrameEnds", "small_texts"]

SMALL_MAX = 125  # payload bytes a frame's 7-bit length holds
_FIN_TEXT = 0x81  # FIN, no RSV bit (no extension is negotiated), opcode 1
_MASKED = 0x80


def small_texts(data: bytes) -> list[bytes] | None:
    """The payloads of `data`, unmasked, if it is one or more whole final masked text
    frames of at most SMALL_MAX bytes with valid UTF-8; else None (the library reads it)."""
    texts: list[bytes] = []
    i, n = 0, len(data)
    while i < n:
        if n - i < 6 or data[i] != _FIN_TEXT:
            return None
        b1 = data[i + 1]
        length = b1 & 0x7F
        end = i + 6 + length
        if not b1 & _MASKED or length > SMALL_MAX or end > n:
            return None
        payload = apply_mask(data[i + 6 : end], data[i + 2 : i + 6])
        if not payload.isascii():
            try:
                payload.decode()
            except UnicodeDecodeError:
                return None  # the library closes with 1007
        texts.append(payload)
        i = end
    return texts


class FrameEnds:
    """Where the frames end in a stream of client bytes, read by read: `at_boundary` when
    everything so far was whole frames. Headers only; payloads are skipped."""

    __slots__ = ("_left", "_tail")

    def __init__(self) -> None:
        self._left = 0  # bytes of the frame in progress still to come
        self._tail = b""  # the start of a header cut off at the end of the last read

    @property
    def at_boundary(self) -> bool:
        return not self._left and not self._tail

    def feed(self, data: bytes) -> None:
        """`data`, the next read, as the library parses it."""
        left = self._left
        if left >= len(data):
            self._left = left - len(data)
            return
        buf = self._tail + data if self._tail else data
        i, n = left, len(buf)
        while n - i >= 2:
            b1 = buf[i + 1]
            length = b1 & 0x7F
            head = 2 if length < 126 else 4 if length == 126 else 10
            if b1 & _MASKED:
                head += 4
            if n - i < head:
                break
            if length == 126:
                length = int.from_bytes(buf[i + 2 : i + 4], "big")
            elif length == 127:
                length = int.from_bytes(buf[i + 2 : i + 10], "big")
            end = i + head + length
            if end > n:
                self._left, self._tail = end - n, b""
                return
            i = end
        self._left, self._tail = 0, bytes(buf[i:])
