"""Test doubles shipped with the code (as httpx ships MockTransport): one place for the
in-memory stand-ins that unit tests, examples and benchmarks share.

- `FakeGatewayClient`: the gateway RPC seam (`ManyGatewayClient`) in memory;
  `deliver_one` and `deliver_alone`, one batch through either seam (a batch of one).
- `MemoryBus`: the `memory://` bus, in-process (from `router.bus.memory`);
  `UnreachableTransport`, a bus transport that answers no publish.
- `ManualClock`: the injected clock, moved by hand (from `shared.clock`).
- The stores in memory, behind the router's seams (`router.testing.routes`,
  `router.testing.stores`): `MemoryRouteRegistry`, `MemoryGatewayFleet`,
  `MemoryDrainRequests`, `MemoryRecoveryLog`, `MemoryReceiptStore`, `MemoryJobStore`,
  `MemoryStatsStore`; with the HTTP edge's own (`push_service.testing`:
  `MemoryIdempotencyStore`, `MemoryRateLimiter`), the push service's HTTP routes run on
  them without Redis (tests/api).
- `router.testing.pubsub.LatencyPublisher`: a real gRPC Pub/Sub Publisher server that
  injects latency and failures (imported on its own: it loads grpc and google).

Integration tests use the real things: real Redis, gRPC servers and processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from router.bus.memory import MemoryBus, MemoryTransport
from router.gateway_rpc.base import Batches, EachGatewayClient, ManyGatewayClient, Replies
from router.hedging import Attempt, AttemptContext
from router.testing.routes import MemoryDrainRequests, MemoryGatewayFleet, MemoryRouteRegistry
from router.testing.stores import (
    MemoryJobStore,
    MemoryReceiptStore,
    MemoryRecoveryLog,
    MemoryStatsStore,
)
from shared.clock import ManualClock
from shared.errors import BusUnavailable, GatewayUnavailable
from shared.proto import gateway_pb2

__all__ = [
    "FakeGatewayClient",
    "ManualClock",
    "MemoryBus",
    "MemoryDrainRequests",
    "MemoryGatewayFleet",
    "MemoryJobStore",
    "MemoryReceiptStore",
    "MemoryRecoveryLog",
    "MemoryRouteRegistry",
    "MemoryStatsStore",
    "UnreachableTransport",
    "deliver_alone",
    "deliver_one",
]


class UnreachableTransport(MemoryTransport):
    """A bus transport that answers no publish (a bus out): every attempt fails as an
    outage's, worth another try; `attempts` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def attempt(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> Attempt[str]:
        async def fail(ctx: AttemptContext) -> str:
            self.attempts += 1
            raise BusUnavailable("bus unreachable: no publish answered")

        return fail

    def is_retryable(self, exc: BaseException) -> bool:
        return True


class FakeGatewayClient:
    """A gateway client that answers every batch as delivered to all of its uids.

    - `delay_s`: each call answers after this long; a call whose deadline is shorter
      fails with DEADLINE_EXCEEDED once the deadline has passed.
    - `block`: when set to an Event, every call waits for it first.
    - `codes` / `many_codes`: the next calls of one batch / of several fail, one gRPC
      status code each, in order ("OK": that call does not); `fail`: every call fails
      with this code.
    - `expired`: every batch is answered as arrived after its ttl.

    It records each call's batch ids (`calls`, joined by ","; `sizes`, batches per call),
    what it was told to retain, and whether it was closed.
    """

    def __init__(
        self,
        *codes: str,
        delay_s: float = 0.0,
        fail: str | None = None,
        expired: bool = False,
    ) -> None:
        self.codes = list(codes)
        self.many_codes: list[str] = []
        self.delay_s = delay_s
        self.fail = fail
        self.expired = expired
        self.block: asyncio.Event | None = None
        self.calls: list[str] = []
        self.sizes: list[int] = []
        self.retained: list[dict[str, str]] = []
        self.closed = False

    async def deliver_many(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> Replies:
        codes = self.codes if len(batches) == 1 else self.many_codes
        await self._call(gateway_id, batches, timeout_s, codes)
        return [self._reply(b) for b in batches]

    def retain(self, live: Mapping[str, str]) -> None:
        self.retained.append(dict(live))

    async def close(self) -> None:
        self.closed = True

    async def _call(
        self,
        gateway_id: str,
        batches: Sequence[gateway_pb2.Batch],
        timeout_s: float,
        codes: list[str],
    ) -> None:
        self.calls.append(",".join(b.batch_id for b in batches))
        self.sizes.append(len(batches))
        if self.block is not None:
            await self.block.wait()
        if self.delay_s:
            await asyncio.sleep(min(self.delay_s, timeout_s))
            if timeout_s < self.delay_s:
                raise GatewayUnavailable(
                    gateway_id, "DEADLINE_EXCEEDED: injected", "DEADLINE_EXCEEDED"
                )
        code = codes.pop(0) if codes else self.fail
        if code is not None and code != "OK":
            raise GatewayUnavailable(gateway_id, f"{code}: injected", code)

    def _reply(self, batch: gateway_pb2.Batch) -> gateway_pb2.DeliverReply:
        if self.expired:
            return gateway_pb2.DeliverReply(expired=True)
        return gateway_pb2.DeliverReply(delivered=list(batch.uids))


async def deliver_one(
    clients: ManyGatewayClient,
    gateway_id: str,
    address: str,
    batch: gateway_pb2.Batch,
    timeout_s: float,
) -> gateway_pb2.DeliverReply:
    """One batch as a call of one (`deliver_many`): its reply, or the call's error raised."""
    [reply] = await clients.deliver_many(gateway_id, address, [batch], timeout_s)
    return reply


async def deliver_alone(
    clients: EachGatewayClient,
    gateway_id: str,
    address: str,
    batch: gateway_pb2.Batch,
    timeout_s: float,
) -> gateway_pb2.DeliverReply:
    """One batch delivered on its own (`deliver_each`): its reply, or the error it failed
    with raised."""
    [reply] = await clients.deliver_each(gateway_id, address, [batch], timeout_s)
    if isinstance(reply, GatewayUnavailable):
        raise reply
    return reply
