"""The gateway's bus consumer hands each batch over with its place in the topic's log:
the batch's own (logged apart, before it was published) or, where the stream is the log,
the one the publish gave its entry (the `seq` and `epoch` attributes)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from router.bus import BROADCAST, MemoryBus
from router.bus.base import EPOCH, SEQ
from shared.batches import to_batch
from shared.models import Message
from shared.proto import gateway_pb2
from socket_gateway.bus_consumer import UNREADABLE, consume


def data(n: int, seq: int = 0) -> bytes:
    batch = to_batch(Message(f"m{n}", f"p{n}", 0, "admin", b"1", 1), ["u1"], f"b{n}")
    batch.seq, batch.epoch = seq, 5 if seq else 0
    return batch.SerializeToString()


async def test_each_batch_is_handed_over_at_its_place_in_the_log() -> None:
    got: list[tuple[str, int, int]] = []
    done = asyncio.Event()

    async def offer(topic: str, batch: gateway_pb2.Batch) -> None:
        got.append((batch.batch_id, batch.seq, batch.epoch))
        if len(got) == 3:
            done.set()

    async with MemoryBus() as bus:
        await bus.prepare([BROADCAST], "gw1")
        task = asyncio.create_task(consume(bus, "gw1", "g1", offer))
        await bus.publish(BROADCAST, data(1), {SEQ: "7", EPOCH: "1733"})  # given by the log
        await bus.publish(BROADCAST, data(2, seq=3))  # logged apart: its own
        await bus.publish(BROADCAST, data(3))  # not logged
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert got == [("b1", 7, 1733), ("b2", 3, 5), ("b3", 0, 0)]


async def test_an_unreadable_batch_is_logged_and_acked_and_those_behind_it_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A `seq` that is no counter (another writer on the bus, a version that writes it
    otherwise) was a ValueError that restarted the consumer on the same entry, five
    times, and drained the gateway: every gateway, for a broadcast."""
    got: list[str] = []
    done = asyncio.Event()
    before = UNREADABLE.total

    async def offer(topic: str, batch: gateway_pb2.Batch) -> None:
        got.append(batch.batch_id)
        if batch.batch_id == "b4":
            done.set()

    async with MemoryBus() as bus:
        await bus.prepare([BROADCAST], "gw1")
        task = asyncio.create_task(consume(bus, "gw1", "g1", offer))
        await bus.publish(BROADCAST, data(1), {SEQ: "7x"})
        await bus.publish(BROADCAST, data(2), {SEQ: "-1"})  # no uint64
        await bus.publish(BROADCAST, b"\xff not a batch")
        await bus.publish(BROADCAST, data(4), {SEQ: "8", EPOCH: "1733"})
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert got == ["b4"]
    assert UNREADABLE.total - before == 3  # counted (imroute_gateway_unreadable_batches_total)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lines) <= 1, lines  # and said, one line per 10 s
