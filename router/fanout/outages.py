"""Work no caller waits on rides out a Redis that cannot answer for a while.

A broadcast or multicast was accepted with 202: its caller is gone, and a job that ends
`failed` on a Redis Cluster failover (a node timeout, then an election: about 5-10 s)
or a Redis restart (a few seconds) broke what the 202 promised. So the job's own Redis
steps (a multicast's look-ups and receipt, a batch's log entry and stored content) are
tried again for a while; so are an Idempotency-Key's release or answer written after
the request was answered (`push_service.idempotency`). Requests a caller waits on never
do this: they answer 503 at once, and the caller retries with its Idempotency-Key.

An error reply that another try would get again (RegistryRefused: a key of the wrong
type, a script's error, OOM) is not an outage: it is raised at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shared.backoff import backoff_s
from shared.errors import RegistryRefused, RegistryUnavailable
from shared.throttled import ThrottledLine

__all__ = ["RIDE_OUT_S", "TRIED_AGAIN", "ride_out"]

T = TypeVar("T")

log = logging.getLogger(__name__)

RIDE_OUT_S = 20.0  # twice a Cluster failover

# Every step of every job tries again while Redis is out (a broadcast's batches, each
# a few times a second): one line per 10 s says how many tries were made, and the last.
TRIED_AGAIN = ThrottledLine(
    log,
    "Redis did not answer %(n)d step(s) of work no caller waits on, tried again; "
    "the last %(what)s: %(exc)s (next in %(delay).2f s)",
)


async def ride_out(
    step: Callable[[], Awaitable[T]],
    what: str,
    budget_s: float = RIDE_OUT_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`step`, tried again while Redis cannot answer (RegistryUnavailable), waiting 0.25 s
    doubling to 2 s, for `budget_s` at most; then its last error. RegistryRefused is
    raised at once."""
    deadline = clock() + budget_s
    failures = 0
    while True:
        try:
            return await step()
        except RegistryRefused:
            raise
        except RegistryUnavailable as exc:
            failures += 1
            delay = backoff_s(failures, 0.25, 2.0, rand=None)
            if clock() + delay > deadline:
                raise
            TRIED_AGAIN.note(what=what, exc=exc, delay=delay)
            await sleep(delay)
