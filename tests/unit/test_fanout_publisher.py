"""BatchPublisher: every batch ends published or failed, never both, under an id that is
the same wherever and however often it is built."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

import pytest

from router.bus import HedgedBus
from router.fanout.broadcast import run_broadcast
from router.fanout.failures import MAX_CONSECUTIVE_FAILURES
from router.fanout.publisher import (
    BROADCAST_TOPIC,
    BatchPublisher,
    PushCounters,
    stable_batch_id,
)
from router.hedging import RetrySettings
from router.recovery.base import OFFLINE_TOPIC
from router.testing import UnreachableTransport
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


class Taking:
    """A bus that takes every publish, and a batch log: what each was given."""

    def __init__(self) -> None:
        self.taken: list[tuple[gateway_pb2.Batch, dict[str, str]]] = []
        self.logged: list[tuple[str, gateway_pb2.Batch]] = []
        self.content = None  # no content stored apart

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        self.taken.append((gateway_pb2.Batch.FromString(data), dict(attributes or {})))
        return str(len(self.taken))

    async def append_batch(self, topic: str, batch: gateway_pb2.Batch) -> int:
        self.logged.append((topic, gateway_pb2.Batch.FromString(batch.SerializeToString())))
        return len(self.logged)


async def test_a_batch_published_again_carries_the_same_id() -> None:
    bus = Taking()

    async def publish(uids: list[str], push_id: str = "p1") -> None:
        m = Message("m1", push_id, 0, "admin", b'{"a":1}', 1)
        batches = BatchPublisher(bus, m, 0, PushCounters())
        await batches.publish(gateway_pb2.MODE_BROADCAST, BROADCAST_TOPIC, uids)

    await publish(["a", "b"])
    await publish(["a", "b"])  # e.g. by the process that resumed the job
    await publish(["a", "c"])
    await publish(["a", "b"], push_id="p2")
    ids = [batch.batch_id for batch, _ in bus.taken]
    assert ids[0] == ids[1] and len(set(ids)) == 3
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert [attrs["batch_id"] for _, attrs in bus.taken] == ids
    first = bus.taken[0][0]
    assert (list(first.uids), first.message.content_json) == (["a", "b"], b'{"a":1}')


async def test_a_batch_is_logged_under_the_id_it_is_published_with() -> None:
    bus = Taking()
    batches = BatchPublisher(bus, message(), 0, PushCounters(), bus)  # type: ignore[arg-type]
    await batches.publish(gateway_pb2.MODE_MULTICAST, "group.g1", ["a", "b"], group_id="g1")
    await batches.record_offline(["c"])
    ((published, attributes),) = bus.taken
    (topic, logged), (offline_topic, offline) = bus.logged
    assert topic == "group.g1" and logged.batch_id == published.batch_id
    assert attributes["batch_id"] == published.batch_id == stable_batch_id(published)
    assert offline.batch_id == stable_batch_id(offline) != published.batch_id
    assert offline_topic == OFFLINE_TOPIC and list(offline.uids) == ["c"]
    assert offline.mode == gateway_pb2.MODE_MULTICAST


class Handed:
    """Counts the batches handed to the bus."""

    def __init__(self, bus: HedgedBus[UnreachableTransport]) -> None:
        self.bus = bus
        self.calls = 0

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        self.calls += 1
        return await self.bus.publish(topic, data, attributes)


async def test_a_batch_is_retried_by_the_bus_alone() -> None:
    """One retry layer per hop: the bus's, within its total timeout; the batch publisher
    hands each batch over once and counts what the bus gave up on."""
    transport, counters = UnreachableTransport(), PushCounters()
    retry = RetrySettings(initial_backoff_s=0.001, max_backoff_s=0.001, total_timeout_s=0.03)
    async with HedgedBus(transport, retry=retry) as bus:
        handed = Handed(bus)
        publisher = BatchPublisher(handed, message(), 0, counters)
        with pytest.raises(BusUnavailable, match="bus unreachable"):
            await publisher.publish(gateway_pb2.MODE_BROADCAST, BROADCAST_TOPIC, ["a"])
    assert handed.calls == 1 and transport.attempts > 1
    assert (counters.batches, counters.published, counters.failed_batches) == (1, 0, 1)


class LoggingBus(FlakyBus):
    """A bus whose publish logs the batch in its topic's log (the stream as the log)."""

    logs_topics = True


@pytest.mark.parametrize("logs_topics", [True, False])
async def test_a_batch_is_logged_apart_only_where_the_bus_does_not_log_it(
    logs_topics: bool,
) -> None:
    from router.testing.stores import MemoryRecoveryLog

    recovery = MemoryRecoveryLog()
    bus = LoggingBus(fail_from=10) if logs_topics else FlakyBus(fail_from=10)
    publisher = BatchPublisher(bus, message(), 0, PushCounters(), recovery)
    await run_broadcast(pages(3, 2), publisher)
    await publisher.record_offline(["u9"])  # on no bus: always logged apart
    assert bus.published == [BROADCAST_TOPIC, BROADCAST_TOPIC]
    logged = {topic: len(batches) for topic, batches in recovery.batches.items()}
    assert logged == ({OFFLINE_TOPIC: 1} if logs_topics else {BROADCAST_TOPIC: 2, OFFLINE_TOPIC: 1})


async def test_a_batch_logged_apart_whose_publish_failed_is_not_failed() -> None:
    """The Pub/Sub trial: a publish that timed out (the emulator stopped) after the
    batch was logged in Redis ended the broadcast `failed`, the page listed "to send
    again", though the gateways wrote it to every client from the log. Where the bus is
    the log (Redis Streams), a failed publish logged nothing: still failed."""
    from router.fanout.publisher import FROM_LOG
    from router.testing.stores import MemoryRecoveryLog

    recovery = MemoryRecoveryLog()
    counters = PushCounters()
    bus = FlakyBus(fail_from=1)
    publisher = BatchPublisher(bus, message(), 0, counters, recovery)
    before = FROM_LOG.total
    await run_broadcast(pages(3, 2, 4, 1), publisher)
    assert (counters.batches, counters.published, counters.failed_batches) == (4, 4, 0)
    assert counters.failed == [] and len(recovery.batches[BROADCAST_TOPIC]) == 4
    assert FROM_LOG.total - before == 3  # counted, and said (one line per 10 s)
    # After the failed publish the bus is left alone for BUS_RETRY_S: the log carries
    # the next batches, with no publish timeout each (a Pub/Sub that stays down).
    assert bus.calls == 2

    on_bus = PushCounters()
    logging_bus = LoggingBus(fail_from=1)
    await run_broadcast(pages(3, 2), BatchPublisher(logging_bus, message(), 0, on_bus, recovery))
    assert (on_bus.published, on_bus.failed_batches) == (1, 1)


async def test_the_offline_entry_rides_out_a_redis_blip() -> None:
    """A multicast's offline recipients are logged through a Redis that did not answer
    once: the job goes on, not failed (router.fanout.outages)."""
    from router.testing.stores import MemoryRecoveryLog
    from shared.errors import RegistryUnavailable

    class Blip(MemoryRecoveryLog):
        failures = 1

        async def append_batch(self, topic: str, batch: gateway_pb2.Batch) -> int:
            if self.failures:
                self.failures -= 1
                raise RegistryUnavailable("redis did not answer: connection reset")
            return await super().append_batch(topic, batch)

    recovery = Blip()
    publisher = BatchPublisher(FlakyBus(fail_from=10), message(), 0, PushCounters(), recovery)
    await publisher.record_offline(["u9"])
    assert [list(b.uids) for b in recovery.batches[OFFLINE_TOPIC]] == [["u9"]]
