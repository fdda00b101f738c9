"""What the gateway accepts in a batch, whoever sent it (a router, the bus, a stranger
who got past the token): checked before anything is written to a client.

The push frame is built by copying `content_json` between the frame's own keys
(shared/wire.py), so content that is not exactly one JSON value could close the value
and add keys: `null,"type":"reconnect"` would turn a push into a reconnect order. Ids
and counts are capped because they are kept (the dedupe sets) or looped over.
"""

from __future__ import annotations

import json
from collections import OrderedDict

import orjson

from shared.proto import gateway_pb2

__all__ = [
    "MAX_BATCH_UIDS",
    "MAX_CONTENT_BYTES",
    "MAX_ID_CHARS",
    "MAX_NAME_CHARS",
    "BatchCheck",
]

# What the push service itself accepts (push_service/schemas.py), with room to spare.
MAX_CONTENT_BYTES = 64 * 1024
MAX_ID_CHARS = 128  # batch_id, msg_id, push_id
MAX_NAME_CHARS = 128  # a uid, the sender, the group
MAX_BATCH_UIDS = 10_000  # IMROUTE_BATCH_SIZE's upper bound
# Bus batches of one push share their content: parse it once per message.
_CHECKED = 256


def _no_constant(name: str) -> object:
    # NaN and Infinity are Python's JSON extensions; JavaScript's JSON.parse refuses them.
    raise ValueError(f"{name} is not JSON")


class BatchCheck:
    """`problem(batch)`: None for a batch fit to write, else what is wrong with it."""

    def __init__(self) -> None:
        self._checked: OrderedDict[str, bytes] = OrderedDict()

    def problem(self, batch: gateway_pb2.Batch) -> str | None:
        if len(batch.batch_id) > MAX_ID_CHARS:
            return f"batch_id over {MAX_ID_CHARS} characters"
        m = batch.message
        if not m.msg_id or len(m.msg_id) > MAX_ID_CHARS or len(m.push_id) > MAX_ID_CHARS:
            return f"msg_id and push_id must be 1-{MAX_ID_CHARS} characters"
        if len(getattr(m, "from")) > MAX_NAME_CHARS or len(batch.group_id) > MAX_NAME_CHARS:
            return f"from and group_id must be at most {MAX_NAME_CHARS} characters"
        uids = batch.uids
        if len(uids) > MAX_BATCH_UIDS:
            return f"{len(uids)} uids; at most {MAX_BATCH_UIDS} per batch"
        if any(len(uid) > MAX_NAME_CHARS for uid in uids):
            return f"a uid over {MAX_NAME_CHARS} characters"
        if batch.seqs and len(batch.seqs) != len(uids):
            return "seqs must be empty or one per uid"
        if batch.epochs and len(batch.epochs) != len(batch.seqs):
            return "epochs must be empty or one per seq"
        if batch.everyone and uids:
            return "an everyone batch names no uids"
        return self._content_problem(m.msg_id, m.content_json)

    def _content_problem(self, msg_id: str, content: bytes) -> str | None:
        checked = self._checked
        if checked.get(msg_id) == content:
            checked.move_to_end(msg_id)
            return None
        if len(content) > MAX_CONTENT_BYTES:
            return f"content_json is {len(content)} bytes; the limit is {MAX_CONTENT_BYTES}"
        try:
            # Strict UTF-8 and exactly one JSON value, no NaN: orjson checks all of it,
            # about 10 times faster than json.
            orjson.loads(content)
        except orjson.JSONDecodeError:
            try:
                # What orjson refuses json may take (an escaped lone surrogate); json
                # also names the problem. Strict UTF-8 first (json.loads would also take
                # UTF-16 bytes, which a text frame cannot carry).
                json.loads(content.decode("utf-8"), parse_constant=_no_constant)
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                return f"content_json is not one JSON value: {_short(exc)}"
        checked[msg_id] = content
        if len(checked) > _CHECKED:
            checked.popitem(last=False)
        return None


def _short(exc: Exception) -> str:
    text = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
    return text[:120]
