"""POST /v1/push/batch: up to 1000 P2P messages in one call, each checked and pushed on
its own, so one bad message fails only itself.

A batch's valid messages are pushed together (`Pushes.push`): one log-and-inbox
write for all of them, one route look-up for all their recipients, each gateway's
deliveries in as few calls as its lane makes of them, one receipt write; that is what
makes a batch cheaper per message than as many single pushes. A message with
`wait_ack_ms` is refused (422): a batch is for pushing at volume, and one message
waiting would hold every other answer back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from push_service.push_parse import quick_push
from push_service.schemas import PushIn

__all__ = ["Invalid", "check_messages"]


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
