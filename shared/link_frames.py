"""The delivery link's framing (shared/proto/gateway.proto, `LinkHello`): each message is
a frame, a 4-byte big-endian length and then that many bytes. Pure: no I/O."""

from __future__ import annotations

from shared.errors import PayloadTooLarge

__all__ = ["HEADER_BYTES", "FrameReader", "frame"]

HEADER_BYTES = 4


def frame(payload: bytes) -> bytes:
    """`payload` as one frame."""
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


class FrameReader:
    """Cuts a byte stream into frames; a frame over `limit` bytes raises PayloadTooLarge
    as soon as its header is in (its body is never buffered)."""

    __slots__ = ("_buf", "limit")

    def __init__(self, limit: int) -> None:
        self._buf = bytearray()
        self.limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        """The frames `data` completes, in order; the rest waits for more."""
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos, end = 0, len(buf)
        limit = self.limit
        while end - pos >= HEADER_BYTES:
            size = int.from_bytes(buf[pos : pos + HEADER_BYTES], "big")
            if size > limit:
                raise PayloadTooLarge("frame", f"{size} bytes, over the limit of {limit}")
            stop = pos + HEADER_BYTES + size
            if stop > end:
                break
            frames.append(bytes(buf[pos + HEADER_BYTES : stop]))
            pos = stop
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buf)
