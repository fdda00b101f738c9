"""POST /v1/push/batch: up to 1000 P2P messages in one call, each checked and pushed on
its own, so one bad message fails only itself.

All of a batch's messages run at once: their Redis commands share round trips
(router.redis.autopipe) and their deliveries to each gateway share calls
(router.gateway_rpc.coalescer), which is what makes a batch cheaper per message than
as many single pushes. A message with `wait_ack_ms` is refused (422): a batch is for
pushing at volume, and one message waiting would hold every other answer back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from push_service.push_parse import quick_push
from push_service.schemas import PushIn
from push_service.services.pushes import Pushed, Pushes
from shared.errors import ImrouteError

__all__ = ["Invalid", "check_messages", "push_each"]


@dataclass(frozen=True, slots=True)
class Invalid:
    """A message that failed its checks: pydantic's errors, or one field and why."""

    errors: Sequence[Any] = ()
    field: str = ""
    message: str = ""


def check_messages(messages: Sequence[Any], quick: bool = True) -> list[PushIn | Invalid]:
    """Each message as a PushIn (checked as POST /v1/push checks its body), or why not.
    `quick`: the hand checks may vouch for canonical ones (not when the raw body may
    hold a lone surrogate, which json.loads lets through)."""
    checked: list[PushIn | Invalid] = []
    for message in messages:
        push = quick_push(message) if quick else None
        if push is None:
            try:
                push = PushIn.model_validate(message)
            except ValidationError as exc:
                checked.append(Invalid(exc.errors(include_url=False)))
                continue
        if push.wait_ack_ms is not None:
            checked.append(
                Invalid(field="wait_ack_ms", message="not in a batch: use POST /v1/push")
            )
            continue
        checked.append(push)
    return checked


async def push_each(pushes: Pushes, bodies: Sequence[PushIn]) -> list[Pushed | ImrouteError]:
    """Push every body at once; each one's answer, or the error of ours it raised."""

    async def one(body: PushIn) -> Pushed | ImrouteError:
        try:
            return await pushes.push(body)
        except ImrouteError as exc:
            return exc

    return list(await asyncio.gather(*(one(b) for b in bodies)))
