"""What a resumable job keeps in its record, so that any push service can run it on.

Only broadcasts are resumable: their pages come from the directory in uid order, so a
checkpoint (the last uid done) says exactly what is left. A multicast's batches mix
recipients of several input chunks per group, and its `to` list (up to 1M uids) is not
kept; it ends failed if its process stops (docs/guides/jobs.md, "Push jobs").
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shared.errors import InvalidInput
from shared.models import Message

__all__ = ["BroadcastSpec"]


@dataclass(frozen=True, slots=True)
class BroadcastSpec:
    message: Message  # the same ids and timestamp in every run: clients see one push
    expires_ms: int
    store: bool
    tags_any: tuple[str, ...] | None
    online_only: bool
    batch_size: int

    def to_json(self) -> str:
        m = self.message
        return json.dumps(
            {
                "kind": "broadcast",
                "message": {
                    "msg_id": m.msg_id,
                    "push_id": m.push_id,
                    "msg_type": m.msg_type,
                    "sender": m.sender,
                    "content_json": m.content_json.decode(),
                    "ts_ms": m.ts_ms,
                },
                "expires_ms": self.expires_ms,
                "store": self.store,
                "tags_any": list(self.tags_any) if self.tags_any is not None else None,
                "online_only": self.online_only,
                "batch_size": self.batch_size,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str) -> BroadcastSpec:
        """The spec a job record holds; InvalidInput if it is not a broadcast's."""
        try:
            data = json.loads(raw)
            if data.get("kind") != "broadcast":
                raise InvalidInput("spec", f"not a broadcast: {data.get('kind')!r}")
            m = data["message"]
            tags = data["tags_any"]
            return cls(
                Message(
                    str(m["msg_id"]),
                    str(m["push_id"]),
                    int(m["msg_type"]),
                    str(m["sender"]),
                    str(m["content_json"]).encode(),
                    int(m["ts_ms"]),
                ),
                int(data["expires_ms"]),
                bool(data["store"]),
                tuple(str(t) for t in tags) if tags is not None else None,
                bool(data["online_only"]),
                int(data["batch_size"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInput("spec", f"unreadable: {exc}") from None
