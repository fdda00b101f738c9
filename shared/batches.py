"""The Batch the router sends a gateway (by gRPC or the bus): built from a Message, read back.

Kept apart from `shared.wire` (the client's frames) so that what reads client frames
does not import protobuf.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.models import Message
from shared.proto import gateway_pb2

__all__ = ["message_of", "to_batch"]


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
            **_sender(message.sender),
        ),
        uids=uids,
        mode=gateway_pb2.MODE_P2P,
    )


def _sender(sender: str) -> dict[str, Any]:
    # `from` is a Python keyword: the field can only be given by name in a dict.
    return {"from": sender}


def message_of(batch: gateway_pb2.Batch) -> Message:
    """The message a Batch carries, as the gateway builds its frame from it."""
    m = batch.message
    return Message(m.msg_id, m.push_id, m.msg_type, getattr(m, "from"), m.content_json, m.ts_ms)
