"""The memory bus, in-process: what it does beyond the Bus contract tests (which run it
too, in tests/integration/test_bus.py), and what its docstring says it does not do."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from router.bus import BROADCAST, MemoryBus, group_topic
from tests.bus_reads import assert_quiet, take

G1 = group_topic("g1")


async def test_unacked_messages_come_again_when_the_subscriber_subscribes_again() -> None:
    async with MemoryBus() as bus:
        await bus.prepare([BROADCAST, G1], "gw1")
        for data in (b"one", b"two", b"three"):
            await bus.publish(BROADCAST, data)
        await bus.publish(G1, b"four")
        async with aclosing(bus.subscribe([BROADCAST, G1], "gw1")) as messages:
            got = await take(messages, 4)
            assert [r.data for r in got] == [b"one", b"two", b"three", b"four"]
            await got[1].ack()
            await got[1].ack()  # acking twice is harmless
        async with aclosing(bus.subscribe([BROADCAST, G1], "gw1")) as messages:
            again = await take(messages, 3)
            # In publish order, with their ids, ahead of anything newer.
            assert [r.data for r in again] == [b"one", b"three", b"four"]
            assert [r.message_id for r in again] == [
                got[0].message_id,
                *(r.message_id for r in got[2:]),
            ]
            for r in again:
                await r.ack()
            await assert_quiet(messages, 0.05)


async def test_subscribers_are_independent_and_start_at_their_first_subscription() -> None:
    async with MemoryBus() as bus:
        await bus.prepare([BROADCAST], "gw1")
        await bus.publish(BROADCAST, b"before gw2")
        messages2 = bus.subscribe([BROADCAST], "gw2")
        first = asyncio.create_task(anext(messages2))  # the first read subscribes gw2
        await asyncio.sleep(0)
        await bus.publish(BROADCAST, b"after gw2")
        assert (await asyncio.wait_for(first, 1)).data == b"after gw2"
        await messages2.aclose()
        async with aclosing(bus.subscribe([BROADCAST], "gw1")) as messages:
            assert [r.data for r in await take(messages, 2)] == [b"before gw2", b"after gw2"]


async def test_nothing_crosses_bus_objects() -> None:
    async with MemoryBus() as one, MemoryBus() as other:
        await one.prepare([BROADCAST], "gw1")
        await other.prepare([BROADCAST], "gw1")
        await one.publish(BROADCAST, b"only on one")
        async with aclosing(other.subscribe([BROADCAST], "gw1")) as messages:
            await assert_quiet(messages, 0.05)


async def test_a_subscriber_that_left_is_kept_nothing_and_starts_again_when_it_comes_back() -> None:
    async with MemoryBus() as bus:
        await bus.prepare([BROADCAST, G1], "gw1")
        await bus.publish(BROADCAST, b"held")
        await bus.leave([BROADCAST, G1], "gw1")
        await bus.publish(BROADCAST, b"while away")
        await bus.leave([BROADCAST], "gw1")  # twice is harmless
        await bus.prepare([BROADCAST], "gw1")
        await bus.publish(BROADCAST, b"back")
        async with aclosing(bus.subscribe([BROADCAST], "gw1")) as messages:
            assert [r.data for r in await take(messages, 1)] == [b"back"]
            await assert_quiet(messages, 0.05)
