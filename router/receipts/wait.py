"""Waiting for acks (`wait_ack_ms`): read the receipt's states until every online
recipient acked or the time is up.

It polls, at 10 ms and then less often (at most every WAIT_POLL_MAX_S): acks reach the
receipt in batches (each gateway writes its acks every 50 ms), and a read of a few
fields of one hash is cheap, where a notification channel would cost a subscription
per waiting request, or one per process, and a notice lost on a reconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from router.receipts.base import ACKED, ReceiptReads
from shared.clock import Clock

__all__ = ["WAIT_POLL_MAX_S", "wait_acks"]

WAIT_POLL_FIRST_S = 0.01
WAIT_POLL_MAX_S = 0.1


async def wait_acks(
    reads: ReceiptReads,
    push_id: str,
    online: Sequence[str],
    uids: Sequence[str],
    wait_s: float,
    clock: Clock,
) -> dict[str, str]:
    """Each uid's state once every one of `online` acked, or after `wait_s`."""
    deadline = clock.monotonic() + wait_s
    interval = WAIT_POLL_FIRST_S
    while True:
        states = await reads.states(push_id, uids)
        left = deadline - clock.monotonic()
        if left <= 0 or all(states.get(u) == ACKED for u in online):
            return states
        await asyncio.sleep(min(interval, left))
        interval = min(interval * 2, WAIT_POLL_MAX_S)
