"""The gateway's ack flushes: what arrives while one is written goes in the next."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from shared.clock import SystemClock
from socket_gateway.acks import AckReporter
from socket_gateway.connections import LocalConnections


class NoInbox:
    async def forget_inboxes(self, wanted: Sequence[tuple[str, Sequence[int]]]) -> list[None]:
        return [None for _ in wanted]


class SlowReceipts:
    """Holds each write until the test lets it go."""

    def __init__(self) -> None:
        self.writes: list[dict[str, list[str]]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def mark(self, state: str, by_push: Mapping[str, Sequence[str]]) -> None:
        self.writes.append({p: list(u) for p, u in by_push.items()})
        self.started.set()
        await self.release.wait()


async def test_updates_that_arrive_during_a_flush_are_written_by_the_next_one() -> None:
    receipts = SlowReceipts()
    reporter = AckReporter(LocalConnections(), NoInbox(), receipts, SystemClock(), flush_s=0.01)
    reporter.report("d", "push-1", ["ana"])
    await asyncio.wait_for(receipts.started.wait(), 5)
    reporter.report("d", "push-2", ["ben"])  # while the first flush is written
    receipts.release.set()
    async with asyncio.timeout(5):
        while reporter.pending:
            await asyncio.sleep(0.01)
    assert receipts.writes == [{"push-1": ["ana"]}, {"push-2": ["ben"]}]
    await reporter.aclose()
