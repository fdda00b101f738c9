"""The P2P client wrapper: retries on the same gateway, circuit breaking (pure: a fake
inner client, a ManualClock, no sleeping)."""

from __future__ import annotations

import asyncio

import pytest

from router.balancing import BreakerState, RetryPolicy, StatsRegistry, StatsSettings
from router.resilient_client import ResilientGatewayClient
from shared.clock import ManualClock
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2


class Inner:
    """Fails with the queued codes first, then answers."""

    def __init__(self, *codes: str) -> None:
        self.codes = list(codes)
        self.calls: list[str] = []
        self.block: asyncio.Event | None = None

    async def deliver(
        self, gateway_id: str, address: str, batch: gateway_pb2.Batch, timeout_s: float
    ) -> gateway_pb2.DeliverReply:
        self.calls.append(batch.batch_id)
        if self.block is not None:
            await self.block.wait()
        if self.codes:
            code = self.codes.pop(0)
            raise GatewayUnavailable(gateway_id, f"{code}: injected", code)
        return gateway_pb2.DeliverReply(delivered=list(batch.uids))

    async def close(self) -> None:
        pass


def wrapper(inner: Inner, retries: int = 1, failures: int = 3) -> ResilientGatewayClient:
    clock = ManualClock()
    stats = StatsRegistry(clock, StatsSettings(failure_threshold=failures, cool_off_s=5))

    async def no_wait(_: float) -> None:
        pass

    return ResilientGatewayClient(
        inner, stats, RetryPolicy(max_retries_same=retries, max_retries_next=0), no_wait
    )


BATCH = gateway_pb2.Batch(batch_id="b1", uids=["u"])


async def test_unavailable_is_retried_on_the_same_gateway_with_the_same_batch() -> None:
    inner = Inner("UNAVAILABLE")
    reply = await wrapper(inner).deliver("gw1", "addr", BATCH, 1.0)
    assert list(reply.delivered) == ["u"]
    assert inner.calls == ["b1", "b1"]  # same batch id: the gateway drops a repeat


@pytest.mark.parametrize("code", ["DEADLINE_EXCEEDED", "INTERNAL", "INVALID_ARGUMENT"])
async def test_other_errors_are_not_retried(code: str) -> None:
    inner = Inner(code)
    with pytest.raises(GatewayUnavailable, match=code):
        await wrapper(inner).deliver("gw1", "addr", BATCH, 1.0)
    assert len(inner.calls) == 1


async def test_retries_stop_at_the_limit() -> None:
    inner = Inner("UNAVAILABLE", "UNAVAILABLE", "UNAVAILABLE")
    with pytest.raises(GatewayUnavailable, match="UNAVAILABLE"):
        await wrapper(inner, retries=1, failures=10).deliver("gw1", "addr", BATCH, 1.0)
    assert len(inner.calls) == 2


async def test_the_circuit_opens_and_then_fails_fast() -> None:
    inner = Inner(*["UNAVAILABLE"] * 3)
    client = wrapper(inner, retries=0, failures=3)
    for _ in range(3):
        with pytest.raises(GatewayUnavailable):
            await client.deliver("gw1", "addr", BATCH, 1.0)
    assert client.stats.breaker("gw1").state is BreakerState.OPEN
    with pytest.raises(GatewayUnavailable) as info:
        await client.deliver("gw1", "addr", BATCH, 1.0)
    assert info.value.code == "CIRCUIT_OPEN"
    assert len(inner.calls) == 3  # the fourth never reached the gateway
    assert client.stats.breaker("gw2").state is BreakerState.CLOSED  # per gateway


async def test_a_cancelled_call_leaves_nothing_in_flight() -> None:
    inner = Inner()
    inner.block = asyncio.Event()
    client = wrapper(inner)
    task = asyncio.ensure_future(client.deliver("gw1", "addr", BATCH, 1.0))
    await asyncio.sleep(0)
    assert client.stats.in_flight("gw1") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.stats.in_flight("gw1") == 0
    assert client.stats.stats("gw1").failures == 0  # not the gateway's fault


class Raising:
    """A listener that fails in every hook."""

    def __getattr__(self, name: str) -> object:
        def hook(*args: object) -> None:
            raise RuntimeError(f"listener bug in {name}")

        return hook


async def test_a_listener_that_raises_does_not_fail_the_call() -> None:
    from router.balancing import Listeners

    inner = Inner("UNAVAILABLE")
    client = wrapper(inner)
    client._listeners = Listeners([Raising()])  # type: ignore[list-item]
    reply = await client.deliver("gw1", "addr", BATCH, 1.0)
    assert list(reply.delivered) == ["u"]
    assert len(inner.calls) == 2  # the retry still happened


async def test_metrics_count_attempts_retries_and_failures() -> None:
    from prometheus_client import CollectorRegistry

    from router.balancing import Listeners
    from router.call_metrics import CallMetrics

    registry = CollectorRegistry()
    client = wrapper(Inner("UNAVAILABLE", "INTERNAL"), retries=1, failures=10)
    client._listeners = Listeners([CallMetrics(registry)])
    with pytest.raises(GatewayUnavailable):
        await client.deliver("gw1", "addr", BATCH, 1.0)  # UNAVAILABLE, retried, INTERNAL
    await client.deliver("gw1", "addr", BATCH, 1.0)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"gateway": "gw1", **labels})

    assert value("imroute_gateway_call_attempts_total", outcome="failure") == 2
    assert value("imroute_gateway_call_attempts_total", outcome="success") == 1
    assert value("imroute_gateway_call_retries_total") == 1
    assert value("imroute_gateway_calls_failed_total") == 1
    assert value("imroute_gateway_call_seconds_count") == 1
