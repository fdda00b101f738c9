"""What the hedger's unit tests share: scripted attempts, an observer that records, and
a hedger on a ManualClock with a chosen number of tokens."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from router.hedging import AttemptContext, Hedger, HedgingSettings, RetrySettings
from router.testing import ManualClock

__all__ = [
    "Calls",
    "Fatal",
    "Recorder",
    "Retryable",
    "advance",
    "hedger",
    "one_delay_in",
    "settle",
    "start",
]


class Retryable(Exception):
    pass


class Fatal(Exception):
    pass


@dataclass
class Recorder:
    """A HedgeObserver that keeps everything."""

    attempts: list[bool] = field(default_factory=list)
    wins: int = 0
    n_cancelled: int = 0
    token_values: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    def attempt(self, topic: str, hedge: bool) -> None:
        self.attempts.append(hedge)

    def hedge_won(self, topic: str) -> None:
        self.wins += 1

    def cancelled(self, topic: str, n: int) -> None:
        self.n_cancelled += n

    def tokens(self, topic: str, value: float) -> None:
        self.token_values.append(value)

    def latency(self, topic: str, seconds: float) -> None:
        self.latencies.append(seconds)


class Calls:
    """An attempt function whose calls the test answers, one future per call."""

    def __init__(self) -> None:
        self.pending: list[tuple[AttemptContext, asyncio.Future[str]]] = []
        self.cancelled: list[int] = []

    async def __call__(self, ctx: AttemptContext) -> str:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending.append((ctx, future))
        try:
            return await future
        except asyncio.CancelledError:
            self.cancelled.append(ctx.hedge)
            raise

    @property
    def hedges(self) -> list[int]:
        return [ctx.hedge for ctx, _ in self.pending]

    def answer(self, index: int, value: str | BaseException) -> None:
        future = self.pending[index][1]
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def start(h: Hedger, calls: Calls) -> asyncio.Future[str]:
    """One publish of `calls`, run until it waits for its first answer."""
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    return publish


async def advance(clock: ManualClock, seconds: float) -> None:
    """Let `seconds` pass, and everything they make due run."""
    clock.advance(seconds)
    await settle()


def hedger(
    clock: ManualClock,
    *,
    delay: float | str = 1.0,
    max_tokens: int = 50,
    ratio: float = 0.1,
    tokens: int = 0,
    retry: RetrySettings | None = None,
    observer: Recorder | None = None,
) -> Hedger:
    h = Hedger(
        HedgingSettings(delay, max_tokens, ratio),  # type: ignore[arg-type]
        retry or RetrySettings(),
        clock,
        lambda exc: isinstance(exc, Retryable),
        observer=observer,
        jitter=lambda: 1.0,
    )
    bucket = h.bucket("t")
    assert bucket is not None
    bucket._milli = tokens * 1000
    return h


async def one_delay_in(clock: ManualClock, **kw: Any) -> tuple[Hedger, Calls, asyncio.Future[str]]:
    """A publish on a fresh `hedger(clock, **kw)`, one hedge delay (1 s) after it began."""
    h, calls = hedger(clock, **kw), Calls()
    publish = await start(h, calls)
    await advance(clock, 1.0)
    return h, calls, publish
