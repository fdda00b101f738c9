"""The Bus every process uses: any transport, with retries and hedging applied once.

`HedgedBus(transport, hedging=...)` checks a message against the Bus limits, asks the
transport for its attempt function and runs it under the `Hedger`: the original is
retried on the transport's retryable errors, and, with HedgingSettings, hedged. What
still fails leaves through the transport's error mapping as BusUnavailable. Prepare,
subscribe and close are the transport's own.

The named buses (`RedisStreamsBus`, `PubSubBus`, `MemoryBus`) are this wrapper around
their transport, built from the transport's keyword arguments plus `Publishing`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Generic, Self, TypedDict, TypeVar, Unpack, cast

from router.bus.base import ClosedOnExit, Received, validate_message, validate_topic
from router.bus.losses import BusLosses
from router.bus.transport import BusTransport
from router.hedging import HedgeObserver, Hedger, HedgingSettings, RetrySettings
from router.hedging.hedger import Attempt, AttemptContext
from shared.clock import AsyncClock, SystemClock
from shared.tracing import SpanKind, Status, StatusCode, Tracer

__all__ = ["HedgedBus", "Publishing", "split_publishing", "traced_attempt"]

# Covariant: a HedgedBus of Redis Streams is a HedgedBus of some transport.
T_co = TypeVar("T_co", bound=BusTransport, covariant=True)


class Publishing(TypedDict, total=False):
    """How publishes are retried and hedged: HedgedBus's keyword arguments.

    `hedging` hedges every publish (off by default); `retry` governs retries of the
    original attempt; `observer` gets the publishing metrics; `tracer` makes each
    attempt a span (shared.tracing); `clock` is for tests.
    """

    hedging: HedgingSettings | None
    retry: RetrySettings | None
    observer: HedgeObserver | None
    tracer: Tracer | None
    clock: AsyncClock | None


def split_publishing(options: Mapping[str, Any]) -> tuple[Publishing, dict[str, Any]]:
    """A named bus's keyword arguments: the wrapper's (Publishing), and the transport's."""
    mine = {k: v for k, v in options.items() if k in Publishing.__optional_keys__}
    theirs = {k: v for k, v in options.items() if k not in mine}
    return cast(Publishing, mine), theirs


class HedgedBus(ClosedOnExit, Generic[T_co]):
    """A Bus over `transport`, publishing as `Publishing` says."""

    def __init__(self, transport: T_co, **publishing: Unpack[Publishing]) -> None:
        self._transport = transport
        self._tracer = publishing.get("tracer")
        self._hedger = Hedger(
            publishing.get("hedging"),
            publishing.get("retry") or RetrySettings(),
            publishing.get("clock") or SystemClock(),
            transport.is_retryable,
            message_ordering=transport.message_ordering,
            observer=publishing.get("observer"),
        )

    @property
    def transport(self) -> T_co:
        return self._transport

    @property
    def losses(self) -> BusLosses:
        """Entries the transport trimmed before a live subscriber had read them."""
        return self._transport.losses

    @property
    def logs_topics(self) -> bool:
        """Whether a publish logs its batch in the topic's recovery log too."""
        return self._transport.logs_topics

    @property
    def hedger(self) -> Hedger:
        """The publishes' hedger: its settings, and per topic its bucket and delay."""
        return self._hedger

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        """Publish one message to the topic; returns the transport's message id."""
        validate_topic(topic)
        validate_message(data, attributes)
        with self._transport.errors("publish"):
            attempt = await self._transport.attempt(topic, data, attributes or {})
            if self._tracer is not None:
                attempt = traced_attempt(self._tracer, attempt)
            return await self._hedger.run(topic, attempt)

    async def prepare(self, topics: Sequence[str], subscriber: str) -> None:
        """Create the subscriber's subscriptions now: it gets what is published from here on."""
        await self._transport.prepare(topics, subscriber)

    async def leave(self, topics: Sequence[str], subscriber: str) -> None:
        """The subscriber stopped for good: nothing is kept for it from here on."""
        await self._transport.leave(topics, subscriber)

    def subscribe(self, topics: Sequence[str], subscriber: str) -> AsyncGenerator[Received, None]:
        """The subscriber's messages, until the bus closes or the caller stops iterating."""
        return self._transport.subscribe(topics, subscriber)

    async def close(self) -> None:
        """End every subscription and close the transport; closing twice is harmless."""
        await self._transport.close()

    async def __aenter__(self) -> Self:
        await self._transport.__aenter__()
        return self


def traced_attempt(tracer: Tracer, attempt: Attempt[str]) -> Attempt[str]:
    """`attempt`, each call a `bus.attempt` span under the publish's: the original and
    each of its retries (imroute.attempt 0) and each hedge (1, 2, ...), and how it
    ended: ok, cancelled (a loser, once another attempt won), or failed."""

    async def traced(ctx: AttemptContext) -> str:
        span = tracer.start_span(
            "bus.attempt",
            kind=SpanKind.CLIENT,
            attributes={"imroute.attempt": ctx.hedge, "imroute.hedge": ctx.hedge > 0},
        )
        outcome = "failed"
        try:
            result = await attempt(ctx)
            outcome = "ok"
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.set_attribute("imroute.outcome", outcome)
            span.end()

    return traced
