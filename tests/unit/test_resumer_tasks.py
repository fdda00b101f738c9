"""The resumer's background work (gap fills, move tails): a failure is logged where it
happens, and the gateway's shutdown stops what still runs."""

from __future__ import annotations

import asyncio

import pytest

from router.recovery.base import RecoveryLimits
from shared.clock import SystemClock
from socket_gateway.connections import LocalConnections
from socket_gateway.resume import Resumer


class NoReads:
    """Reads nothing: these tests run no resume."""

    async def read_users(self, wanted: object) -> list[object]:
        raise AssertionError("not read")

    async def ack(self, wanted: object) -> list[None]:
        raise AssertionError("not acked")


def resumer() -> Resumer:
    return Resumer(NoReads(), LocalConnections(), RecoveryLimits(), SystemClock())  # type: ignore[arg-type]


async def test_a_failed_task_is_logged_and_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    r = resumer()

    async def broken() -> None:
        raise KeyError("a bug")

    with caplog.at_level("ERROR", "socket_gateway.resume"):
        r._gaps.spawn(broken())
        for _ in range(3):
            await asyncio.sleep(0)
    assert not r._gaps
    [record] = [x for x in caplog.records if x.name == "socket_gateway.resume"]
    assert record.getMessage() == "a gap fill or move tail failed"
    assert record.exc_info is not None and record.exc_info[0] is KeyError


async def test_aclose_stops_what_still_runs() -> None:
    r = resumer()
    stopped = asyncio.Event()

    async def tail() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()

    r._gaps.spawn(tail())
    await asyncio.sleep(0)
    await r.aclose()
    assert stopped.is_set() and not r._gaps


class HangingReads(NoReads):
    """A log whose topic reads never answer (a Redis that stopped mid-read)."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()

    async def read_span(self, *args: object) -> object:
        try:
            await asyncio.sleep(60)
        finally:
            self.stopped.set()
        raise AssertionError("not reached")


async def test_aclose_stops_a_log_read_under_way() -> None:
    """Before: a read of a topic's log that a resume started outlived the shutdown."""
    reads = HangingReads()
    r = Resumer(reads, LocalConnections(), RecoveryLimits(), SystemClock())  # type: ignore[arg-type]
    waiter = asyncio.ensure_future(r.spans.read("g1", 0, None))
    await asyncio.sleep(0.01)
    assert len(r.spans._tasks) == 1
    await r.aclose()
    assert reads.stopped.is_set() and len(r.spans._tasks) == 0
    with pytest.raises(asyncio.CancelledError):
        await waiter


@pytest.mark.parametrize("started", [True, False], ids=["queued-behind", "not-started"])
async def test_aclose_tells_the_waiters_of_every_read_it_stops(started: bool) -> None:
    """A read queued behind another of its topic, or not started yet, is stopped too:
    its waiters are cancelled, not left waiting (a review found both hanging)."""
    reads = HangingReads()
    r = Resumer(reads, LocalConnections(), RecoveryLimits(), SystemClock())  # type: ignore[arg-type]
    first = asyncio.ensure_future(r.spans.read("g1", 0, None))
    if started:
        await asyncio.sleep(0.01)  # the first read is under way ...
        second = asyncio.ensure_future(r.spans.read("g1", 0, None))
        await asyncio.sleep(0.01)  # ... and the second is queued behind it
        waiters = [first, second]
    else:
        await asyncio.sleep(0)  # the read is spawned, and has not run a step
        waiters = [first]
    await r.aclose()  # in this task: a task of its own would let the read start first
    for waiter in waiters:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiter, 1.0)
    assert not r.spans._next and not r.spans._flying
