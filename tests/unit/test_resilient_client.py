"""The P2P client wrapper: retries on the same gateway, circuit breaking (pure: a fake
inner client, a ManualClock, no sleeping)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from router.balancing import BreakerState, RetryPolicy, StatsRegistry, StatsSettings
from router.gateway_rpc.base import Batches, Replies
from router.gateway_rpc.client import CallMetrics, CoalescingGatewayClient, ResilientGatewayClient
from router.testing import FakeGatewayClient, ManualClock, deliver_alone
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2


def wrapper(
    inner: FakeGatewayClient,
    retries: int = 1,
    failures: int = 3,
    metrics: CallMetrics | None = None,
) -> ResilientGatewayClient:
    clock = ManualClock()
    stats = StatsRegistry(clock, StatsSettings(failure_threshold=failures, cool_off_s=5))

    async def no_wait(_: float) -> None:
        pass

    policy = RetryPolicy(max_retries_same=retries)
    return ResilientGatewayClient(inner, stats, policy, no_wait, metrics)


BATCH = gateway_pb2.Batch(batch_id="b1", uids=["u"])


async def one(client: ResilientGatewayClient) -> gateway_pb2.DeliverReply:
    """BATCH in a call of its own."""
    (reply,) = await client.deliver_many("gw1", "addr", [BATCH], 1.0)
    return reply


async def test_unavailable_is_retried_on_the_same_gateway_with_the_same_batch() -> None:
    inner = FakeGatewayClient("UNAVAILABLE")
    reply = await one(wrapper(inner))
    assert list(reply.delivered) == ["u"]
    assert inner.calls == ["b1", "b1"]  # same batch id: the gateway drops a repeat


@pytest.mark.parametrize("code", ["DEADLINE_EXCEEDED", "INTERNAL", "INVALID_ARGUMENT"])
async def test_other_errors_are_not_retried(code: str) -> None:
    inner = FakeGatewayClient(code)
    with pytest.raises(GatewayUnavailable, match=code):
        await one(wrapper(inner))
    assert len(inner.calls) == 1


async def test_retries_stop_at_the_limit() -> None:
    inner = FakeGatewayClient("UNAVAILABLE", "UNAVAILABLE", "UNAVAILABLE")
    with pytest.raises(GatewayUnavailable, match="UNAVAILABLE"):
        await one(wrapper(inner, retries=1, failures=10))
    assert len(inner.calls) == 2


async def test_the_circuit_opens_and_then_fails_fast() -> None:
    inner = FakeGatewayClient(*["UNAVAILABLE"] * 3)
    client = wrapper(inner, retries=0, failures=3)
    for _ in range(3):
        with pytest.raises(GatewayUnavailable):
            await one(client)
    assert client.stats.breaker("gw1").state is BreakerState.OPEN
    with pytest.raises(GatewayUnavailable) as info:
        await one(client)
    assert info.value.code == "CIRCUIT_OPEN"
    assert len(inner.calls) == 3  # the fourth never reached the gateway
    assert client.stats.breaker("gw2").state is BreakerState.CLOSED  # per gateway


async def test_a_cancelled_call_leaves_nothing_in_flight() -> None:
    inner = FakeGatewayClient()
    inner.block = asyncio.Event()
    client = wrapper(inner)
    task = asyncio.ensure_future(one(client))
    await asyncio.sleep(0)
    assert client.stats.in_flight("gw1") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.stats.in_flight("gw1") == 0
    assert client.stats.stats("gw1").failures == 0  # not the gateway's fault


async def test_metrics_count_attempts_retries_and_failures() -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics = CallMetrics(registry)
    client = wrapper(
        FakeGatewayClient("UNAVAILABLE", "INTERNAL"), retries=1, failures=10, metrics=metrics
    )
    with pytest.raises(GatewayUnavailable):
        await one(client)  # UNAVAILABLE, retried, INTERNAL
    await one(client)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"gateway": "gw1", **labels})

    assert value("imroute_gateway_call_attempts_total", outcome="failure") == 2
    assert value("imroute_gateway_call_attempts_total", outcome="success") == 1
    assert value("imroute_gateway_call_retries_total") == 1
    assert value("imroute_gateway_calls_failed_total") == 1
    assert value("imroute_gateway_call_seconds_count") == 1


async def test_each_failed_attempt_and_the_failed_call_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = wrapper(FakeGatewayClient("UNAVAILABLE", "UNAVAILABLE"), retries=1, failures=10)
    with caplog.at_level(logging.INFO, logger="imroute.calls"), pytest.raises(GatewayUnavailable):
        await one(client)
    assert [(r.levelno, r.getMessage()[:40]) for r in caplog.records] == [
        (logging.INFO, "call to gateway gw1 failed (attempt 1): "),
        (logging.INFO, "call to gateway gw1 failed (attempt 2): "),
        (logging.WARNING, "delivery to gateway gw1 failed after 2 a"),
    ]
    assert all(r.__dict__["gateway_id"] == "gw1" for r in caplog.records)


async def test_a_failed_coalesced_call_counts_once_and_is_retried_whole() -> None:
    """Eight pushes queued behind a busy call share one DeliverMany; it fails once. That
    is one failure for the circuit (threshold 2 here), and one retry of the whole call."""
    inner = FakeGatewayClient()
    resilient = wrapper(inner, retries=1, failures=2)
    client = CoalescingGatewayClient(resilient, max_in_flight=1)
    inner.block = asyncio.Event()
    first = asyncio.create_task(deliver_alone(client, "gw1", "addr", BATCH, 1.0))
    await asyncio.sleep(0)
    queued = [
        asyncio.create_task(
            deliver_alone(
                client, "gw1", "addr", gateway_pb2.Batch(batch_id=f"q{i}", uids=[f"u{i}"]), 1.0
            )
        )
        for i in range(8)
    ]
    await asyncio.sleep(0)
    inner.many_codes = ["UNAVAILABLE"]  # the coalesced call fails once
    inner.block.set()
    await first
    replies = await asyncio.gather(*queued)
    assert [list(r.delivered) for r in replies] == [[f"u{i}"] for i in range(8)]
    many = ",".join(f"q{i}" for i in range(8))
    assert inner.calls == ["b1", many, many]  # the whole call again, same batch ids
    assert resilient.stats.stats("gw1").failures == 1
    assert resilient.stats.breaker("gw1").state is BreakerState.CLOSED


async def test_a_retry_gets_only_the_time_left_and_none_without_it() -> None:
    clock = ManualClock()
    stats = StatsRegistry(clock, StatsSettings(failure_threshold=10, cool_off_s=5))
    timeouts: list[float] = []

    class Slow(FakeGatewayClient):
        async def deliver_many(
            self, gateway_id: str, address: str, batches: Batches, timeout_s: float
        ) -> Replies:
            timeouts.append(timeout_s)
            clock.advance(0.6)  # the connection breaks after 0.6 s
            return await super().deliver_many(gateway_id, address, batches, timeout_s)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    policy = RetryPolicy(max_retries_same=3)
    client = ResilientGatewayClient(Slow("UNAVAILABLE", "UNAVAILABLE"), stats, policy, sleep)
    with pytest.raises(GatewayUnavailable, match="UNAVAILABLE"):
        await one(client)
    # 1.0 s for all attempts: the retry got what was left, and there was no third.
    assert timeouts[0] == 1.0 and 0.2 < timeouts[1] < 0.4 and len(timeouts) == 2


async def test_the_failure_that_opens_the_circuit_is_reported_not_a_refusal() -> None:
    inner = FakeGatewayClient("UNAVAILABLE")
    client = wrapper(inner, retries=1, failures=1)
    with pytest.raises(GatewayUnavailable) as caught:
        await one(client)
    assert caught.value.code == "UNAVAILABLE"  # no retry into the open circuit
    assert inner.calls == ["b1"]
    assert client.stats.breaker("gw1").state is BreakerState.OPEN


@pytest.mark.parametrize("code", ["INTERNAL", "UNIMPLEMENTED", "INVALID_ARGUMENT"])
async def test_an_answered_error_does_not_count_against_the_circuit(code: str) -> None:
    inner = FakeGatewayClient(code, code, code)
    client = wrapper(inner, retries=0, failures=1)
    for _ in range(3):
        with pytest.raises(GatewayUnavailable, match=code):
            await one(client)
    assert client.stats.breaker("gw1").state is BreakerState.CLOSED
