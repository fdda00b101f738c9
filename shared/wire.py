"""Wire formats on the client WebSocket: the push frame and the client's control frames.

The push frame's JSON is built once per message and wrapped in a WebSocket frame
once; the gateway then writes the same bytes to every recipient's transport.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import orjson

from shared.errors import InvalidInput
from shared.models import Message

__all__ = [
    "MAX_ACK_POS",
    "PONG_FRAME",
    "encode_push_json",
    "parse_client_frame",
    "push_frame",
    "push_prefix",
    "recovered_frame",
    "ws_text_frame",
]


def _string(text: str) -> bytes:
    # orjson writes an ASCII string as json.dumps does, about 5 times faster; json.dumps
    # keeps escaping the rest to ASCII, as it always has.
    return orjson.dumps(text) if text.isascii() else json.dumps(text).encode()


def encode_push_json(message: Message) -> bytes:
    """The client-facing JSON of a push; `content_json` is copied verbatim."""
    return b"".join(
        (
            b'{"type":"push","msg_id":',
            _string(message.msg_id),
            b',"push_id":',
            _string(message.push_id),
            b',"msg_type":%d,"from":' % int(message.msg_type),
            _string(message.sender),
            b',"content":',
            message.content_json,
            b',"ts":%d}' % message.ts_ms,
        )
    )


def push_prefix(message: Message) -> bytes:
    """A push frame's JSON up to its position: built once per message, then completed
    per connection by `push_frame` (each connection has its own `pos`)."""
    return encode_push_json(message)[:-1]


def push_frame(prefix: bytes, pos: str, recovered: bool = False) -> bytes:
    """The WebSocket frame of a push for one connection: `prefix` plus its `pos`."""
    tail = b',"recovered":true,"pos":"%s"}' if recovered else b',"pos":"%s"}'
    return ws_text_frame(prefix + tail % pos.encode())


def recovered_frame(count: int, complete: bool) -> bytes:
    """The frame that ends every connection's replay (count 0 when nothing was sent)."""
    flag = b"true" if complete else b"false"
    return ws_text_frame(b'{"type":"recovered","count":%d,"complete":%s}' % (count, flag))


def ws_text_frame(payload: bytes) -> bytes:
    """One unmasked, final WebSocket text frame (RFC 6455 5.2), as a server sends it."""
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x81, n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x81, 126, n)
    else:
        header = struct.pack("!BBQ", 0x81, 127, n)
    return header + payload


PONG_FRAME = ws_text_frame(b'{"type":"pong"}')
# An ack's `pos` is one the gateway wrote (shared.positions.MAX_POS_CHARS at most).
MAX_ACK_POS = 256


def parse_client_frame(text: str) -> str | None:
    """What a client frame is: None for `{"type":"ping"}`, or the `pos` of an ack,
    `{"type":"ack","pos":"<pos>"}` (empty when the ack is malformed: the gateway ignores
    and counts it, never closes for it); InvalidInput for anything else."""
    try:
        frame: Any = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:  # what orjson refuses (NaN, a lone surrogate's escape) json.loads may take
            frame = json.loads(text)
        except ValueError:
            raise InvalidInput("frame", "not JSON") from None
        except RecursionError:  # deeper than orjson's 1024 levels, and json's stack
            raise InvalidInput("frame", "not JSON: nested too deeply") from None
    kind = frame.get("type") if isinstance(frame, dict) else None
    if kind == "ping":
        return None
    if kind == "ack":
        pos = frame.get("pos")
        return pos if isinstance(pos, str) and 0 < len(pos) <= MAX_ACK_POS else ""
    raise InvalidInput("frame", 'only {"type":"ping"} and {"type":"ack","pos":...} are accepted')
