"""BatchPublisher's counters: every batch ends published or failed, never both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

import pytest

from router.fanout.broadcast import run_broadcast
from router.fanout.failures import MAX_CONSECUTIVE_FAILURES
from router.fanout.publisher import BROADCAST_TOPIC, BatchPublisher, PushCounters
from shared.errors import BusUnavailable
from shared.models import Message
from shared.proto import gateway_pb2


class FlakyBus:
    """Publishes until `fail_from` calls were made, then raises BusUnavailable."""

    def __init__(self, fail_from: int) -> None:
        self.fail_from = fail_from
        self.calls = 0
        self.published: list[str] = []

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        self.calls += 1
        if self.calls > self.fail_from:
            raise BusUnavailable("redis streams: connection refused")
        self.published.append(topic)
        return f"id-{self.calls}"


class HangingBus:
    """A publish that never returns (cancelled when the service shuts down)."""

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def message() -> Message:
    return Message(
        msg_id="m1", push_id="p1", msg_type=0, sender="admin", content_json=b"1", ts_ms=1
    )


async def pages(*sizes: int) -> AsyncIterator[Sequence[str]]:
    for n, size in enumerate(sizes):
        yield [f"u{n}-{i}" for i in range(size)]


async def test_a_batch_whose_publish_raised_counts_as_failed_and_the_broadcast_goes_on() -> None:
    counters = PushCounters()
    publisher = BatchPublisher(FlakyBus(fail_from=1), message(), 0, counters)
    await run_broadcast(pages(3, 2, 4), publisher)
    assert (counters.batches, counters.published, counters.failed_batches) == (3, 1, 2)
    assert counters.recipients == 9  # every page was read
    assert [(f.uids, f.after) for f in counters.failed] == [(2, "u0-2"), (4, "u1-1")]


async def test_a_bus_that_stays_down_ends_the_broadcast() -> None:
    counters = PushCounters()
    publisher = BatchPublisher(FlakyBus(fail_from=0), message(), 0, counters)
    with pytest.raises(BusUnavailable):
        await run_broadcast(pages(*[1] * (MAX_CONSECUTIVE_FAILURES + 5)), publisher)
    assert counters.failed_batches == MAX_CONSECUTIVE_FAILURES
    assert counters.recipients == MAX_CONSECUTIVE_FAILURES  # stopped there


async def test_a_broadcast_checkpoints_each_page_and_resumes_after_one() -> None:
    counters = PushCounters()
    bus = FlakyBus(fail_from=10)
    publisher = BatchPublisher(bus, message(), 0, counters)
    marks: list[tuple[str | None, int]] = []

    async def checkpoint(after: str | None, n: int) -> None:
        marks.append((after, n))

    await run_broadcast(pages(2, 1), publisher, checkpoint=checkpoint, done_pages=3, after="x")
    assert marks == [("u0-1", 4), ("u1-0", 5)]
    marks.clear()
    await run_broadcast(None, publisher, checkpoint=checkpoint)  # everyone online
    await run_broadcast(None, publisher, checkpoint=checkpoint, done_pages=1)  # resumed: done
    assert marks == [(None, 1)]
    assert len(bus.published) == 3


async def test_published_batches_are_not_failed() -> None:
    counters = PushCounters()
    bus = FlakyBus(fail_from=10)
    publisher = BatchPublisher(bus, message(), 0, counters)
    await run_broadcast(pages(3, 2), publisher)
    await run_broadcast(None, publisher)  # everyone online: one batch
    assert (counters.batches, counters.published, counters.failed_batches) == (3, 3, 0)
    assert bus.published == [BROADCAST_TOPIC] * 3


async def test_a_group_batch_that_failed_is_counted_per_group_and_failed() -> None:
    counters = PushCounters()
    publisher = BatchPublisher(FlakyBus(fail_from=0), message(), 0, counters)
    with pytest.raises(BusUnavailable):
        await publisher.publish(gateway_pb2.MODE_MULTICAST, "group.g1", ["a"], group_id="g1")
    assert (counters.batches, counters.published, counters.failed_batches) == (1, 0, 1)
    assert counters.per_group == {"g1": 1}


async def test_a_publish_cancelled_at_shutdown_is_not_a_failed_batch() -> None:
    counters = PushCounters()
    publisher = BatchPublisher(HangingBus(), message(), 0, counters)
    task = asyncio.create_task(publisher.publish(gateway_pb2.MODE_BROADCAST, BROADCAST_TOPIC))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (counters.batches, counters.published, counters.failed_batches) == (1, 0, 0)
