"""What a bus transport implements, so that `HedgedBus` can wrap it.

A transport does the I/O of one technology and nothing more: one publish attempt at a
time, which of its errors are worth another try, and the mapping of its library's
errors into ours. Retries and hedging are the wrapper's (`router.bus.hedged`), once for
every transport; so is checking a message against the Bus limits before it is sent.

Subscribing is the transport's own: `prepare`, `subscribe` and `close` keep the
semantics the Bus protocol (router.bus.base) states, and the wrapper hands them on.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol

from router.bus.base import Subscriptions
from router.bus.losses import BusLosses
from router.hedging import Attempt

__all__ = ["BusTransport"]


class BusTransport(Subscriptions, Protocol):
    """One bus technology: publish attempts, its error rules, and the subscriber side."""

    @property
    def losses(self) -> BusLosses:
        """What the transport lost: entries trimmed before a live subscriber read them."""
        ...

    @property
    def logs_topics(self) -> bool:
        """Whether a publish also logs the batch in its topic's recovery log, and gives
        it its seq there (the entry's `seq` and `epoch` attributes)."""
        ...

    @property
    def message_ordering(self) -> bool:
        """Whether publishes keep their order (ordering keys): hedging is refused then."""
        ...

    async def attempt(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> Attempt[str]:
        """Get ready to publish one checked message (encode it once, connect, refuse if
        closed) and return the function of one attempt, which the wrapper calls for the
        original, each of its retries and each hedge; it returns the message id."""
        ...

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether a failed attempt is worth another try (the original's retries)."""
        ...

    def errors(self, operation: str) -> AbstractContextManager[None]:
        """Raise the library's errors from inside as BusUnavailable, naming `operation`."""
        ...
