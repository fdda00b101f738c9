"""Wire formats: the Batch the router sends a gateway, and on the client WebSocket the
push frame and the client's control frames.

The push frame's JSON is built once per message and wrapped in a WebSocket frame
once; the gateway then writes the same bytes to every recipient's transport.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from shared.errors import InvalidInput
from shared.models import Message
from shared.proto import gateway_pb2

__all__ = [
    "PONG_FRAME",
    "encode_push_json",
    "message_of",
    "parse_client_frame",
    "to_batch",
    "ws_text_frame",
]


def to_batch(message: Message, uids: Sequence[str], batch_id: str) -> gateway_pb2.Batch:
    """A P2P Batch of `message` for `uids`; callers set the mode and the rest."""
    return gateway_pb2.Batch(
        batch_id=batch_id,
        message=gateway_pb2.Message(
            msg_id=message.msg_id,
            push_id=message.push_id,
            msg_type=message.msg_type,
            content_json=message.content_json,
            ts_ms=message.ts_ms,
            **{"from": message.sender},
        ),
        uids=uids,
        mode=gateway_pb2.MODE_P2P,
    )


def message_of(batch: gateway_pb2.Batch) -> Message:
    """The message a Batch carries, as the gateway builds its frame from it."""
    m = batch.message
    return Message(m.msg_id, m.push_id, m.msg_type, getattr(m, "from"), m.content_json, m.ts_ms)


def encode_push_json(message: Message) -> bytes:
    """The client-facing JSON of a push; `content_json` is copied verbatim."""
    head = (
        f'{{"type":"push","msg_id":{json.dumps(message.msg_id)},'
        f'"push_id":{json.dumps(message.push_id)},"msg_type":{int(message.msg_type)},'
        f'"from":{json.dumps(message.sender)},"content":'
    )
    return b"".join((head.encode(), message.content_json, b',"ts":%d}' % message.ts_ms))


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


def parse_client_frame(text: str) -> str:
    """Return the type of a client frame; raise InvalidInput for anything else."""
    try:
        frame: Any = json.loads(text)
    except ValueError:
        raise InvalidInput("frame", "not JSON") from None
    if not isinstance(frame, dict) or frame.get("type") != "ping":
        raise InvalidInput("frame", 'only {"type":"ping"} is accepted from clients')
    return "ping"
