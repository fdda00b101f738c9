"""What a resumable job keeps in its record, so that any push service can run it on.

Both modes are resumable from a checkpoint (`router.jobs.base.Checkpoint`):

- a broadcast's pages come from the directory in uid order, so the last uid done says
  exactly what is left;
- a multicast takes its recipients in chunks (a `to` list, kept here whole while the
  job runs, or the directory's pages of a `tags_any` audience) and checkpoints only
  between chunks with every group buffer flushed (`router.fanout.multicast`), so the
  chunks done, and for an audience the last uid done, say what is left.

The message is kept whole: every run sends the same ids and timestamp, so clients see
one push. The spec leaves the record with the job's end (`finish.lua`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import orjson

from shared.errors import InvalidInput
from shared.models import Message

__all__ = ["BroadcastSpec", "MulticastSpec"]


@dataclass(frozen=True, slots=True)
class BroadcastSpec:
    message: Message  # the same ids and timestamp in every run: clients see one push
    expires_ms: int
    store: bool
    tags_any: tuple[str, ...] | None
    online_only: bool
    batch_size: int

    def to_json(self) -> bytes:
        return _dump("broadcast", self)

    @classmethod
    def from_json(cls, raw: str | bytes) -> BroadcastSpec:
        """The spec a job record holds; InvalidInput if it is not a broadcast's."""
        return _load(cls, "broadcast", raw)


@dataclass(frozen=True, slots=True)
class MulticastSpec:
    """`to` or `tags_any` names the recipients; `chunk` is how many uids a chunk (a
    checkpoint's unit) takes, `batch_size` how many a batch: a resumed run cuts the
    input as the first one did, so the batches it sends again keep their ids."""

    message: Message
    expires_ms: int
    store: bool
    high_priority: bool
    to: Sequence[str] | None  # the request's own list, not copied (a tuple when read back)
    tags_any: tuple[str, ...] | None
    chunk: int
    batch_size: int

    def __post_init__(self) -> None:
        if (self.to is None) == (self.tags_any is None):
            raise ValueError("exactly one of to and tags_any")
        if self.chunk < 1:
            raise ValueError(f"chunk {self.chunk}")

    def to_json(self) -> bytes:
        return _dump("multicast", self)

    @classmethod
    def from_json(cls, raw: str | bytes) -> MulticastSpec:
        """The spec a job record holds; InvalidInput if it is not a multicast's."""
        return _load(cls, "multicast", raw)


Spec = TypeVar("Spec", BroadcastSpec, MulticastSpec)


def _dump(kind: str, spec: BroadcastSpec | MulticastSpec) -> bytes:
    """Its fields by name, the message's too (its content as the JSON text it is).
    orjson, and bytes written as they are: a multicast's `to` may hold a million uids
    (up to 130 MB in a 160-MB request), so no copy more than needed."""
    record = {"kind": kind, **{f.name: getattr(spec, f.name) for f in fields(spec)}}
    return orjson.dumps(record, default=_text)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    raise TypeError(f"{type(value).__name__} is not part of a spec")


def _load(cls: type[Spec], kind: str, raw: str | bytes) -> Spec:
    """What `_dump` wrote, each field read back as its type; InvalidInput if it cannot be."""
    try:
        data = orjson.loads(raw)
        if data.get("kind") != kind:
            raise InvalidInput("spec", f"not a {kind}: {data.get('kind')!r}")
        m = data["message"]
        message = Message(
            str(m["msg_id"]),
            str(m["push_id"]),
            int(m["msg_type"]),
            str(m["sender"]),
            str(m["content_json"]).encode(),
            int(m["ts_ms"]),
        )
        rest = {f.name: _READ[f.name](data[f.name]) for f in fields(cls) if f.name != "message"}
        return cls(message, **rest)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInput("spec", f"unreadable: {exc}") from None


def _strings(values: Any) -> tuple[str, ...] | None:
    if values is None:
        return None
    if not isinstance(values, list):
        raise TypeError(f"a list, not {type(values).__name__}")
    return tuple(str(v) for v in values)


# How each field other than the message is read back.
_READ: dict[str, Callable[[Any], Any]] = {
    "expires_ms": int,
    "store": bool,
    "tags_any": _strings,
    "online_only": bool,
    "batch_size": int,
    "high_priority": bool,
    "to": _strings,
    "chunk": int,
}
