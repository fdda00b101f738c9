"""Waiting for acks (`wait_ack_ms`): read the receipt's states until every online
recipient acked or the time is up.

It polls: every 10 ms for the first 100 ms (most acks land there: a client's ack
frame, then the gateway's next flush, at most 50 ms later), every 25 ms to 500 ms,
then every 100 ms. A read of a few fields of one hash is cheap, where a notification
channel would cost a subscription per waiting request, or one per process, and a
notice lost on a reconnect. (Doubling from 10 ms saw half the acks only at 70 ms:
`docs/benchmarks/index.md`, wait_ack_ms.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from router.receipts.base import ACKED, ReceiptReads
from shared.clock import Clock

__all__ = ["WAIT_POLLS", "WAIT_POLL_MAX_S", "poll_interval", "wait_acks"]

# (until, every): poll every `every` seconds until `until` seconds in, then the next.
WAIT_POLLS = ((0.1, 0.01), (0.5, 0.025))
WAIT_POLL_MAX_S = 0.1


def poll_interval(waited_s: float) -> float:
    """How long to wait before the next read, `waited_s` into the wait (pure)."""
    for until, every in WAIT_POLLS:
        if waited_s < until:
            return every
    return WAIT_POLL_MAX_S


async def wait_acks(
    reads: ReceiptReads,
    push_id: str,
    online: Sequence[str],
    uids: Sequence[str],
    wait_s: float,
    clock: Clock,
) -> dict[str, str]:
    """Each uid's state once every one of `online` acked, or after `wait_s`."""
    began = clock.monotonic()
    deadline = began + wait_s
    while True:
        states = await reads.states(push_id, uids)
        now = clock.monotonic()
        left = deadline - now
        if left <= 0 or all(states.get(u) == ACKED for u in online):
            return states
        await asyncio.sleep(min(poll_interval(now - began), left))
