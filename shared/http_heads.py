"""How large an HTTP request head may be, on every HTTP listener, sans I/O.

A request head is the request line, the header fields and the blank line after them.
Each listener (the push service under uvicorn, the gateway's WebSocket port, the
gateway's metrics port) counts a head's bytes as they arrive and stops taking them
past `HeadLimits.max_bytes`, so a head costs at most that much memory and time however
it is sent (one read or a byte at a time). What is over a limit gets a `HeadRefusal`:
431 for the bytes and the count of header fields, 414 for the request target (path and
query), each answered in JSON and the connection closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.settings import HttpHeadSettings

__all__ = [
    "END_OF_HEAD",
    "HeadLimits",
    "HeadRefusal",
    "check_head",
    "check_request",
    "gather_head",
]

END_OF_HEAD = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class HeadRefusal:
    """Why a head is refused: the HTTP status and the JSON `error` (also the kind it is
    counted under) and `detail`."""

    status: int
    error: str
    detail: str


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """The bounds of one request head (IMROUTE_HTTP_MAX_HEAD_BYTES, _MAX_HEADERS,
    _MAX_URL_BYTES): nginx's 8 KiB request line and h11's 16 KiB head, and about
    the header count Apache and the websockets library allow."""

    max_bytes: int = 16 * 1024
    max_headers: int = 100
    max_url_bytes: int = 8000

    @classmethod
    def from_settings(cls, settings: HttpHeadSettings) -> HeadLimits:
        return cls(
            max_bytes=settings.http_max_head_bytes,
            max_headers=settings.http_max_headers,
            max_url_bytes=settings.http_max_url_bytes,
        )

    def too_large(self) -> HeadRefusal:
        return HeadRefusal(
            431,
            "headers_too_large",
            f"the request line and headers are over {self.max_bytes} bytes "
            "(IMROUTE_HTTP_MAX_HEAD_BYTES)",
        )

    def too_many_headers(self) -> HeadRefusal:
        return HeadRefusal(
            431,
            "too_many_headers",
            f"the request has over {self.max_headers} header fields (IMROUTE_HTTP_MAX_HEADERS)",
        )

    def url_too_long(self) -> HeadRefusal:
        return HeadRefusal(
            414,
            "uri_too_long",
            f"the request target (path and query) is over {self.max_url_bytes} bytes "
            "(IMROUTE_HTTP_MAX_URL_BYTES)",
        )

    def url_room(self, prefix: str) -> int:
        """How many bytes may follow `prefix` (e.g. "/ws?token=") in a request target."""
        return self.max_url_bytes - len(prefix.encode())


def check_request(target_bytes: int, headers: int, limits: HeadLimits) -> HeadRefusal | None:
    """The refusal of a parsed request whose target and header count are these, if any."""
    if target_bytes > limits.max_url_bytes:
        return limits.url_too_long()
    if headers > limits.max_headers:
        return limits.too_many_headers()
    return None


def check_head(head: bytes | bytearray, limits: HeadLimits) -> HeadRefusal | None:
    """The refusal of a whole head (up to and including its blank line), if any. The
    header count is the count of lines, so a folded line counts as a field of its own."""
    if len(head) > limits.max_bytes:
        return limits.too_large()
    line_end = head.find(b"\n")
    parts = head[:line_end].split(b" ")
    target = len(parts[1]) if len(parts) == 3 else 0
    # Every line ends in LF: the request line's, each field's and the blank line's.
    return check_request(target, head.count(b"\n") - 2, limits)


def gather_head(
    buffer: bytearray, data: bytes, limits: HeadLimits
) -> tuple[bytes, bytes] | HeadRefusal | None:
    """Add a read to the head gathered so far in `buffer`: (the head, the bytes after it)
    once it is whole and within the limits, a refusal, or None for more.

    `buffer` never holds more than `limits.max_bytes`: of `data`, only what fits is
    added, and the end of the head is looked for from where the last look stopped, so
    a head sent a byte at a time costs time in proportion to its length.
    """
    seen = len(buffer)
    room = limits.max_bytes - seen
    buffer += data[:room]
    end = buffer.find(END_OF_HEAD, max(0, seen - 3))
    if end < 0:
        return limits.too_large() if len(data) > room else None
    end += len(END_OF_HEAD)
    head = bytes(buffer[:end])
    refusal = check_head(head, limits)
    if refusal is not None:
        return refusal
    return head, bytes(buffer[end:]) + data[room:]
