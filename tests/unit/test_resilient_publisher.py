"""ResilientPublisher: bounded retries with backoff, and batch ids stable across re-publishes."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from router.fanout.publisher import BROADCAST_TOPIC, BatchPublisher, PushCounters
from router.fanout.resilient import PublishRetry, ResilientPublisher
from shared.errors import BusUnavailable, PayloadTooLarge
from shared.models import Message
from shared.proto import gateway_pb2


class Bus:
    """Raises the queued errors first, then takes every publish."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.taken: list[tuple[gateway_pb2.Batch, dict[str, str]]] = []

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.taken.append((gateway_pb2.Batch.FromString(data), dict(attributes or {})))
        return str(self.calls)


class Sleeps:
    def __init__(self) -> None:
        self.slept: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)


def message(push_id: str = "p1", msg_id: str = "m1") -> Message:
    return Message(msg_id, push_id, 0, "admin", b'{"a":1}', 1)


async def publish(bus: Bus, sleeps: Sleeps, uids: list[str], push_id: str = "p1") -> None:
    resilient = ResilientPublisher(bus, PublishRetry(3, 0.5, 1.5), sleeps)
    batches = BatchPublisher(resilient, message(push_id), 0, PushCounters())
    await batches.publish(gateway_pb2.MODE_BROADCAST, BROADCAST_TOPIC, uids)


async def test_a_publish_is_retried_with_backoff_until_the_bus_takes_it() -> None:
    bus, sleeps = Bus(BusUnavailable("down"), BusUnavailable("down")), Sleeps()
    await publish(bus, sleeps, ["a", "b"])
    assert bus.calls == 3 and len(bus.taken) == 1
    assert sleeps.slept == [0.5, 1.0]


async def test_the_last_error_is_raised_after_the_retries() -> None:
    bus, sleeps = Bus(*[BusUnavailable(f"down {n}") for n in range(4)]), Sleeps()
    with pytest.raises(BusUnavailable, match="down 3"):
        await publish(bus, sleeps, ["a"])
    assert bus.calls == 4
    assert sleeps.slept == [0.5, 1.0, 1.5]  # capped


async def test_a_refused_batch_is_not_retried() -> None:
    bus, sleeps = Bus(PayloadTooLarge("data", "too big")), Sleeps()
    with pytest.raises(PayloadTooLarge):
        await publish(bus, sleeps, ["a"])
    assert bus.calls == 1 and sleeps.slept == []


async def test_a_batch_published_again_carries_the_same_id() -> None:
    bus, sleeps = Bus(), Sleeps()
    await publish(bus, sleeps, ["a", "b"])
    await publish(bus, sleeps, ["a", "b"])  # e.g. by the process that resumed the job
    await publish(bus, sleeps, ["a", "c"])
    await publish(bus, sleeps, ["a", "b"], push_id="p2")
    ids = [batch.batch_id for batch, _ in bus.taken]
    assert ids[0] == ids[1] and len(set(ids)) == 3
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert [attrs["batch_id"] for _, attrs in bus.taken] == ids
    first = bus.taken[0][0]
    assert (list(first.uids), first.message.content_json) == (["a", "b"], b'{"a":1}')
