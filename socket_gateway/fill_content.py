"""The stored content of the batches a resuming user is named in, filled in copies.

Batches come from the topic logs without their stored content (a push's content over
IMROUTE_BUS_CONTENT_INLINE_MAX): it is fetched for the batches a resuming user is named
in, never for everyone else's, and filled in copies, so the batches the spans hold
(`socket_gateway.topic_spans`), shared by every resume, stay as small as they were read.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.recovery.base import LoggedBatch, RecoveryReads, TopicHistory

__all__ = ["fill_for"]


async def fill_for(
    reads: RecoveryReads, uid: str, topics: Mapping[str, TopicHistory]
) -> dict[str, TopicHistory]:
    """The histories with the stored content of the batches that name `uid` filled in
    (one round trip for all of them), in copies: the batches the spans hold, shared by
    every resume, stay as read. One whose content is gone is left out (a hole: the
    resume is incomplete), as a topic read leaves it out for everyone."""
    wanted = [
        logged
        for history in topics.values()
        for logged in history.batches
        if _unfilled(logged) and logged.addresses(uid)
    ]
    if not wanted:
        return dict(topics)
    copies = [logged.detached() for logged in wanted]
    filled = await reads.fill_content([copy.batch for copy in copies])
    swap: dict[int, LoggedBatch | None] = {
        id(logged): copy if ok else None
        for logged, copy, ok in zip(wanted, copies, filled, strict=True)
    }
    return {
        letter: TopicHistory(h.head, [c for b in h.batches if (c := swap.get(id(b), b))])
        for letter, h in topics.items()
    }


def _unfilled(logged: LoggedBatch) -> bool:
    message = logged.batch.message
    return message.content_stored and not message.content_json
