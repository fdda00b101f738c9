"""HedgedBus around a transport whose attempts fail as the test says: the wrapper checks
messages before the transport sees them, retries on the transport's retryable errors,
and maps what still fails through the transport's error mapping."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

import pytest

from router.bus import BROADCAST, HedgedBus, MemoryTransport
from router.hedging import Attempt, AttemptContext, HedgingSettings, RetrySettings
from shared.errors import BusUnavailable, InvalidInput

FAST_RETRY = RetrySettings(initial_backoff_s=0.001, max_backoff_s=0.001)


class LibraryError(Exception):
    """What a transport's library raises."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class FlakyTransport(MemoryTransport):
    """The memory transport, whose first attempts fail with the errors in `failures`."""

    def __init__(self, *failures: LibraryError, ordered: bool = False) -> None:
        super().__init__()
        self.failures = list(failures)
        self.attempts: list[AttemptContext] = []
        self.readied = 0
        self.message_ordering = ordered  # type: ignore[misc]

    async def attempt(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> Attempt[str]:
        self.readied += 1
        append = await super().attempt(topic, data, attributes)

        async def flaky(ctx: AttemptContext) -> str:
            self.attempts.append(ctx)
            if self.failures:
                raise self.failures.pop(0)
            return await append(ctx)

        return flaky

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, LibraryError) and exc.retryable

    def errors(self, operation: str) -> AbstractContextManager[None]:
        return _mapped(operation)


@contextmanager
def _mapped(operation: str) -> Iterator[None]:
    try:
        yield
    except LibraryError as exc:
        raise BusUnavailable(f"flaky {operation}: {exc}") from exc


async def test_the_original_is_retried_on_the_transports_retryable_errors() -> None:
    transport = FlakyTransport(LibraryError("busy", True), LibraryError("busy", True))
    async with HedgedBus(transport, retry=FAST_RETRY) as bus:
        assert await bus.publish(BROADCAST, b"x") == "m-1"
    assert [ctx.hedge for ctx in transport.attempts] == [0, 0, 0]
    assert transport.readied == 1  # the message is made ready once, then attempted


async def test_what_fails_for_good_leaves_through_the_transports_mapping() -> None:
    transport = FlakyTransport(LibraryError("refused", False))
    async with HedgedBus(transport, retry=FAST_RETRY) as bus:
        with pytest.raises(BusUnavailable, match="flaky publish: refused"):
            await bus.publish(BROADCAST, b"x")
    assert len(transport.attempts) == 1


async def test_a_message_is_checked_before_the_transport_sees_it() -> None:
    transport = FlakyTransport()
    async with HedgedBus(transport) as bus:
        with pytest.raises(InvalidInput, match="topic"):
            await bus.publish("nowhere", b"x")
        with pytest.raises(InvalidInput, match="data"):
            await bus.publish(BROADCAST, b"")
    assert transport.readied == 0


def test_hedging_a_transport_that_keeps_order_is_refused() -> None:
    with pytest.raises(ValueError, match="ordering"):
        HedgedBus(FlakyTransport(ordered=True), hedging=HedgingSettings())
    HedgedBus(FlakyTransport(ordered=True))  # no hedging: fine
