"""The gateway's bus consumer is supervised: it used to die on any unexpected exception
while the heartbeat kept the gateway in the fleet, deaf to every broadcast. Now it is
restarted; if it keeps dying, the gateway drains (leaves the fleet, moves its clients)
and its process exits non-zero. Real Redis Streams; the failure is injected where the
consumer meets the bus."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest

from router.bus.base import BROADCAST, Received
from router.bus.factory import bus_from_settings
from shared.batches import to_batch
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import Message
from shared.proto import gateway_pb2
from socket_gateway.app import Gateway
from socket_gateway.metrics import render
from socket_gateway.supervise import RestartBudget
from tests.integration.stack import client, recv_json, settings
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


class BrokenSubscriptions:
    """A real bus whose first `failures` subscriptions die of a bug."""

    def __init__(self, inner: Any, failures: int) -> None:
        self.inner, self.failures = inner, failures

    def subscribe(self, topics: Sequence[str], subscriber: str) -> AsyncGenerator[Received, None]:
        if self.failures > 0:
            self.failures -= 1
            return self._boom()
        subscription: AsyncGenerator[Received, None] = self.inner.subscribe(topics, subscriber)
        return subscription

    async def _boom(self) -> AsyncGenerator[Received, None]:
        raise RuntimeError("an unexpected bug")
        yield  # pragma: no cover - makes this a generator

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def broadcast(n: int) -> bytes:
    message = Message(f"m{n}", f"p{n}", 0, "admin", b"%d" % n, SystemClock().now_ms())
    batch = to_batch(message, [], f"b{n}")
    batch.everyone, batch.mode = True, gateway_pb2.MODE_BROADCAST
    return batch.SerializeToString()


async def test_a_consumer_that_dies_is_restarted(redis_url: str, prefix: str) -> None:
    s = settings(redis_url, prefix, gateway_id="gw1", group_id="g1")
    async with bus_from_settings(s) as bus:
        flaky = BrokenSubscriptions(bus, failures=2)
        gw = Gateway(s, bus=flaky)  # type: ignore[arg-type]
        gw.consumer_budget = RestartBudget(gw.clock, first_delay_s=0.05)
        async with gw, client(gw, "alice") as ws:
            await wait_for(lambda: gw.consumer_restarts == 2, "two restarts")
            await bus.publish(BROADCAST, broadcast(1))
            assert (await recv_json(ws))["content"] == 1  # listening again
            assert gw.failure is None
            assert "imroute_gateway_bus_consumer_restarts_total 2.0" in render(gw.metrics).decode()


async def test_a_consumer_that_keeps_dying_drains_the_gateway(
    redis_url: str, prefix: str, redis: Any
) -> None:
    s = settings(redis_url, prefix, gateway_id="gw1", group_id="g1", drain_window_s=0)
    async with bus_from_settings(s) as bus:
        flaky = BrokenSubscriptions(bus, failures=1000)
        gw = Gateway(s, bus=flaky)  # type: ignore[arg-type]
        gw.consumer_budget = RestartBudget(gw.clock, max_failures=3, first_delay_s=0.05)
        async with gw, client(gw, "alice") as ws:
            await wait_for(gw.drained.is_set, "the drain", timeout=10)
            assert gw.failure is not None and "3 times within a minute" in gw.failure
            frame = await recv_json(ws)
            assert frame["type"] == "reconnect", frame  # its clients are sent elsewhere
            # Out of the fleet's choices: its record says draining, or is gone.
            record = await redis.get(KeySchema(prefix).gateway("gw1"))
            assert record is None or '"draining":true' in record.replace(" ", "")
