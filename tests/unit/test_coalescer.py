"""The Deliver coalescing logic, with an in-memory gateway client (pure logic)."""

from __future__ import annotations

import asyncio

import pytest

from router.gateway_rpc.base import Batches, Replies
from router.gateway_rpc.client import CoalescingGatewayClient
from router.testing import FakeGatewayClient, deliver_alone
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2


def batch(uid: str) -> gateway_pb2.Batch:
    return gateway_pb2.Batch(batch_id=uid, uids=[uid])


async def test_low_load_sends_each_batch_alone() -> None:
    gw = FakeGatewayClient(delay_s=0.001)
    client = CoalescingGatewayClient(gw, max_in_flight=2)
    for i in range(3):
        reply = await deliver_alone(client, "gw1", "a:1", batch(f"u{i}"), 1.0)
        assert list(reply.delivered) == [f"u{i}"]
    assert gw.sizes == [1, 1, 1]


async def test_under_load_queued_batches_share_calls_and_get_their_own_replies() -> None:
    gw = FakeGatewayClient(delay_s=0.02)
    client = CoalescingGatewayClient(gw, max_in_flight=2, max_batches=50)
    replies = await asyncio.gather(
        *(deliver_alone(client, "gw1", "a:1", batch(f"u{i}"), 1.0) for i in range(102))
    )
    assert [list(r.delivered) for r in replies] == [[f"u{i}"] for i in range(102)]
    assert gw.sizes[:2] == [1, 1]  # the first two go at once
    assert sum(gw.sizes) == 102
    assert gw.sizes == [1, 1, 50, 50]  # then the 100 queued behind them, 50 per call


async def test_lanes_are_per_gateway() -> None:
    gw = FakeGatewayClient(delay_s=0.02)
    client = CoalescingGatewayClient(gw, max_in_flight=1)
    await asyncio.gather(
        deliver_alone(client, "gw1", "a:1", batch("x"), 1.0),
        deliver_alone(client, "gw2", "b:1", batch("y"), 1.0),
    )
    assert gw.sizes == [1, 1]  # neither waited for the other


async def test_a_failed_call_fails_every_batch_in_it() -> None:
    gw = FakeGatewayClient(delay_s=0.02, fail="UNAVAILABLE")
    client = CoalescingGatewayClient(gw, max_in_flight=1)
    results = await asyncio.gather(
        *(deliver_alone(client, "gw1", "a:1", batch(f"u{i}"), 1.0) for i in range(4)),
        return_exceptions=True,
    )
    assert all(isinstance(r, GatewayUnavailable) for r in results)


async def test_batches_queued_past_their_deadline_fail_without_being_sent() -> None:
    gw = FakeGatewayClient(delay_s=0.1)
    client = CoalescingGatewayClient(gw, max_in_flight=1)
    first = asyncio.create_task(deliver_alone(client, "gw1", "a:1", batch("first"), 1.0))
    await asyncio.sleep(0)
    late = deliver_alone(client, "gw1", "a:1", batch("late"), 0.01)
    with pytest.raises(GatewayUnavailable, match="DEADLINE_EXCEEDED"):
        await late
    await first
    assert gw.sizes == [1]


async def test_close_fails_waiters_and_closes_the_inner_client() -> None:
    gw = FakeGatewayClient(delay_s=0.2)
    client = CoalescingGatewayClient(gw, max_in_flight=1)
    first = asyncio.create_task(deliver_alone(client, "gw1", "a:1", batch("a"), 1.0))
    await asyncio.sleep(0)
    queued = asyncio.create_task(deliver_alone(client, "gw1", "a:1", batch("b"), 1.0))
    await asyncio.sleep(0)
    await client.close()
    with pytest.raises(GatewayUnavailable):
        await queued
    first.cancel()
    assert gw.closed


async def test_calls_are_capped_in_bytes_as_well_as_in_count() -> None:
    gw = FakeGatewayClient(delay_s=0.02)
    client = CoalescingGatewayClient(gw, max_in_flight=1, max_batches=256, max_bytes=10_000)
    big = [gateway_pb2.Batch(batch_id=f"b{i}", uids=["x" * 3000]) for i in range(9)]
    replies = await asyncio.gather(*(deliver_alone(client, "gw1", "a:1", b, 1.0) for b in big))
    assert len(replies) == 9
    # The first goes alone; the eight queued behind it leave three (~9 KB) per call.
    assert gw.sizes == [1, 3, 3, 2]


class BrokenGateway(FakeGatewayClient):
    """A call of several batches raises a bug (a call of one is answered)."""

    async def deliver_many(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> Replies:
        if len(batches) == 1:
            return await super().deliver_many(gateway_id, address, batches, timeout_s)
        raise RuntimeError("a bug, not a gateway error")


async def test_no_caller_hangs_whatever_the_call_raises() -> None:
    client = CoalescingGatewayClient(BrokenGateway(delay_s=0.05), max_in_flight=1)
    results = await asyncio.wait_for(
        asyncio.gather(
            *(deliver_alone(client, "gw1", "a:1", batch(f"u{i}"), 1.0) for i in range(4)),
            return_exceptions=True,
        ),
        2,
    )
    assert list(map(type, results)) == [gateway_pb2.DeliverReply] + [GatewayUnavailable] * 3
    assert "RuntimeError" in str(results[1])


async def test_close_fails_callers_of_a_call_in_flight() -> None:
    gw = FakeGatewayClient(delay_s=5)
    client = CoalescingGatewayClient(gw, max_in_flight=1)
    first = asyncio.create_task(deliver_alone(client, "gw1", "a:1", batch("a"), 10.0))
    await asyncio.sleep(0)
    queued = [
        asyncio.create_task(deliver_alone(client, "gw1", "a:1", batch(f"q{i}"), 10.0))
        for i in range(3)
    ]
    await asyncio.sleep(0)
    first.cancel()  # frees the lane: the three leave in one DeliverMany, which hangs
    await asyncio.sleep(0.01)
    assert gw.sizes == [1, 3]
    await asyncio.wait_for(client.close(), 1)
    for task in queued:
        with pytest.raises(GatewayUnavailable):
            await asyncio.wait_for(task, 1)


async def test_retain_drops_idle_lanes_of_departed_gateways_only() -> None:
    gw = FakeGatewayClient(delay_s=0.05)
    client = CoalescingGatewayClient(gw, max_in_flight=1)
    await deliver_alone(client, "gw1", "a:1", batch("u1"), 1.0)
    busy = asyncio.create_task(deliver_alone(client, "gw2", "b:1", batch("u2"), 1.0))
    await asyncio.sleep(0.01)
    assert len(client) == 2
    client.retain({})  # both left; gw2's lane still has a call in flight
    assert len(client) == 1
    assert gw.retained == [{}]
    assert (await busy).delivered == ["u2"]  # the call in flight was not disturbed
    client.retain({})
    assert len(client) == 0


async def test_per_turn_one_turns_deliveries_share_one_call() -> None:
    """per_turn (the push service's mode): what one loop turn queues for a gateway leaves
    in one call, though call slots were free; each caller gets its own reply."""
    gw = FakeGatewayClient(delay_s=0.001)
    client = CoalescingGatewayClient(gw, max_in_flight=4, per_turn=True)
    replies = await asyncio.gather(
        *(deliver_alone(client, "gw1", "a:1", batch(f"u{i}"), 1.0) for i in range(5)),
        deliver_alone(client, "gw2", "b:1", batch("other"), 1.0),
    )
    assert [list(r.delivered) for r in replies] == [[f"u{i}"] for i in range(5)] + [["other"]]
    assert sorted(gw.sizes) == [1, 5]  # one call per gateway
    # Alone in its turn: a Deliver of its own.
    assert list((await deliver_alone(client, "gw1", "a:1", batch("solo"), 1.0)).delivered) == [
        "solo"
    ]
    assert sorted(gw.sizes) == [1, 1, 5]
    assert client.many_calls == 1


async def test_per_turn_still_queues_behind_busy_slots() -> None:
    gw = FakeGatewayClient(delay_s=0.02)
    client = CoalescingGatewayClient(gw, max_in_flight=1, max_batches=50, per_turn=True)
    first = asyncio.create_task(deliver_alone(client, "gw1", "a:1", batch("first"), 1.0))
    await asyncio.sleep(0.005)  # its call is in flight
    rest = await asyncio.gather(
        *(deliver_alone(client, "gw1", "a:1", batch(f"u{i}"), 1.0) for i in range(60))
    )
    await first
    assert [list(r.delivered) for r in rest] == [[f"u{i}"] for i in range(60)]
    assert gw.sizes == [1, 50, 10]


async def test_deliver_each_sends_many_batches_in_calls_of_max_batches() -> None:
    """The batch endpoint's path: one gateway's deliveries queued at once leave in calls
    of max_batches (in order), within the lane's slots; each gets its own reply."""
    gw = FakeGatewayClient(delay_s=0.001)
    client = CoalescingGatewayClient(gw, max_in_flight=2, max_batches=100, per_turn=True)
    replies = await client.deliver_each("gw1", "a:1", [batch(f"u{i}") for i in range(250)], 1.0)
    assert [list(r.delivered) for r in replies] == [[f"u{i}"] for i in range(250)]  # type: ignore[union-attr]
    assert gw.sizes == [100, 100, 50]
    assert ",".join(gw.calls).split(",") == [f"u{i}" for i in range(250)]


async def test_deliver_each_fails_only_the_batches_of_a_failed_call() -> None:
    gw = FakeGatewayClient(delay_s=0.001)
    gw.many_codes = ["OK", "UNAVAILABLE"]  # the second call fails
    client = CoalescingGatewayClient(gw, max_in_flight=1, max_batches=2, per_turn=True)
    replies = await client.deliver_each("gw1", "a:1", [batch(f"u{i}") for i in range(5)], 1.0)
    kinds = [type(r).__name__ for r in replies]
    assert kinds == ["DeliverReply", "DeliverReply"] + ["GatewayUnavailable"] * 2 + ["DeliverReply"]
