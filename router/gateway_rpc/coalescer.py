"""Coalesces concurrent deliveries to one gateway into shared calls.

At most `max_in_flight` calls per gateway run at once. A call that finds them all
busy queues; when one finishes, everything queued for that gateway (up to
`max_batches`) leaves in one DeliverMany. At low load nothing waits and every push
is a call of its own; under load one RPC carries many pushes, which is what keeps the
per-push cost of gRPC (about 0.2 ms a call on each side) from capping the push rate.

With `per_turn` (the push service's), deliveries also wait for the end of the loop turn
that queued them, and everything queued for a gateway in one turn is one call: pushes
whose Redis replies came in one round trip (router.redis.autopipe) reach that point in
the same turn, so under load they share a call long before the slots run out.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field

from router.gateway_rpc.base import Batches, EachReplies, ManyGatewayClient, gather_each
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2
from shared.tasks import Background

__all__ = ["MAX_CALL_BYTES", "QUEUED_TOO_LONG", "CoalescingGatewayClient"]

log = logging.getLogger(__name__)

# Well under gRPC's 16 MiB message limit, whatever the batches' sizes.
MAX_CALL_BYTES = 4 << 20
# A queued delivery with less time than this left fails without a call.
MIN_CALL_S = 0.005
QUEUED_TOO_LONG = "DEADLINE_EXCEEDED: queued too long"


@dataclass(slots=True)
class _Queued:
    batch: gateway_pb2.Batch
    future: asyncio.Future[gateway_pb2.DeliverReply]
    deadline: float


@dataclass(slots=True)
class _Lane:
    gateway_id: str
    address: str
    in_flight: int = 0
    queue: deque[_Queued] = field(default_factory=deque)
    scheduled: bool = False  # a drain at the end of this loop turn


class CoalescingGatewayClient:
    def __init__(
        self,
        inner: ManyGatewayClient,
        max_in_flight: int = 4,
        max_batches: int = 256,
        max_bytes: int = MAX_CALL_BYTES,
        per_turn: bool = False,
    ) -> None:
        """`per_turn`: gather each loop turn's deliveries to a gateway into one call
        (what the push service runs); without it a delivery with a call slot free is
        sent at once, alone."""
        self._inner = inner
        self._per_turn = per_turn
        self._max_in_flight = max_in_flight
        self._max_batches = max_batches
        self._max_bytes = max_bytes
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self._tasks = Background("a DeliverMany call", log)
        self.many_calls = 0

    def _lane(self, gateway_id: str, address: str) -> _Lane:
        # By id and address: a gateway that takes over another's address gets its own
        # lane, calls and circuit, not the departed one's.
        key = (gateway_id, address)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(gateway_id, address)
        return lane

    async def deliver(
        self, gateway_id: str, address: str, batch: gateway_pb2.Batch, timeout_s: float
    ) -> gateway_pb2.DeliverReply:
        return await self._one(self._lane(gateway_id, address), batch, timeout_s)

    async def deliver_each(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> EachReplies:
        """Every batch queued as a delivery of its own: they leave together, in calls of
        up to max_batches (and max_bytes), within the lane's calls in flight. A batch of
        one is exactly `deliver`."""
        lane = self._lane(gateway_id, address)
        if len(batches) != 1:
            return await gather_each(self._queue(lane, batches, timeout_s))
        try:  # the usual P2P push: no gather, no task, and (per turn) no coroutine
            return [await self._one(lane, batches[0], timeout_s)]
        except GatewayUnavailable as exc:
            return [exc]

    def _one(
        self, lane: _Lane, batch: gateway_pb2.Batch, timeout_s: float
    ) -> Awaitable[gateway_pb2.DeliverReply]:
        """One delivery: a call of its own at once when a slot is free and nothing
        queues (not per turn), else queued. Awaited at once by the caller."""
        if not self._per_turn and lane.in_flight < self._max_in_flight and not lane.queue:
            return self._alone(lane, batch, timeout_s)
        return self._queue(lane, [batch], timeout_s)[0]

    async def _alone(
        self, lane: _Lane, batch: gateway_pb2.Batch, timeout_s: float
    ) -> gateway_pb2.DeliverReply:
        lane.in_flight += 1
        try:
            return (
                await self._inner.deliver_many(lane.gateway_id, lane.address, [batch], timeout_s)
            )[0]
        finally:
            lane.in_flight -= 1
            self._drain(lane)

    def _queue(
        self, lane: _Lane, batches: Batches, timeout_s: float
    ) -> list[asyncio.Future[gateway_pb2.DeliverReply]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        futures: list[asyncio.Future[gateway_pb2.DeliverReply]] = []
        for batch in batches:
            future: asyncio.Future[gateway_pb2.DeliverReply] = loop.create_future()
            lane.queue.append(_Queued(batch, future, deadline))
            futures.append(future)
        if not self._per_turn:
            self._drain(lane)
        elif not lane.scheduled and lane.in_flight < self._max_in_flight:
            # Sent at the end of this turn of the loop, with whatever else this turn
            # queues for the gateway: pushes whose Redis replies came in one round trip
            # (router.redis.autopipe) reach this point together, and leave in one call.
            lane.scheduled = True
            loop.call_soon(self._tick, lane)
        return futures

    def _tick(self, lane: _Lane) -> None:
        lane.scheduled = False
        self._drain(lane)

    def _drain(self, lane: _Lane) -> None:
        """Start calls for what is queued, while the lane has calls to spare."""
        while lane.queue and lane.in_flight < self._max_in_flight:
            items = self._take(lane)
            if not items:
                return
            lane.in_flight += 1
            self._tasks.spawn(self._send(lane, items), f"deliver-many:{lane.gateway_id}")

    def _take(self, lane: _Lane) -> list[_Queued]:
        """The next call's batches: up to max_batches and max_bytes, callers still waiting."""
        now = asyncio.get_running_loop().time()
        items: list[_Queued] = []
        size = 0
        late = 0
        while lane.queue and len(items) < self._max_batches:
            item = lane.queue[0]
            item_size = item.batch.ByteSize()
            if items and size + item_size > self._max_bytes:
                break  # the rest leaves in the next call
            lane.queue.popleft()
            if item.future.done():  # its caller gave up
                continue
            if item.deadline - now < MIN_CALL_S:
                # Too little time left for a call: fail it here, rather than send the
                # gateway a call doomed to time out (and count that against its circuit).
                late += 1
                item.future.set_exception(
                    GatewayUnavailable(lane.gateway_id, QUEUED_TOO_LONG, "DEADLINE_EXCEEDED")
                )
                continue
            items.append(item)
            size += item_size
        if late:
            log.warning(
                "%d deliveries to %s timed out waiting for a call slot", late, lane.gateway_id
            )
        return items

    async def _send(self, lane: _Lane, items: Sequence[_Queued]) -> None:
        timeout = max(min(i.deadline for i in items) - asyncio.get_running_loop().time(), 0.001)
        try:
            replies = await self._call(lane, items, timeout)
            if len(replies) != len(items):
                raise GatewayUnavailable(lane.gateway_id, "DeliverMany: wrong number of replies")
        except BaseException as exc:
            # Whatever happened (a gateway error, a bug, close() cancelling us), every
            # caller waiting on this call hears of it: none may hang.
            if isinstance(exc, GatewayUnavailable):
                error = exc
            else:
                if isinstance(exc, Exception):
                    log.exception("DeliverMany to %s failed unexpectedly", lane.gateway_id)
                error = GatewayUnavailable(lane.gateway_id, f"{type(exc).__name__}: {exc}")
            for item in items:
                if not item.future.done():
                    item.future.set_exception(error)
            if not isinstance(exc, Exception):
                raise
        else:
            for item, reply in zip(items, replies, strict=True):
                if not item.future.done():
                    item.future.set_result(reply)
        finally:
            lane.in_flight -= 1
            self._drain(lane)

    async def _call(
        self, lane: _Lane, items: Sequence[_Queued], timeout_s: float
    ) -> Sequence[gateway_pb2.DeliverReply]:
        if len(items) > 1:
            self.many_calls += 1
        return await self._inner.deliver_many(
            lane.gateway_id, lane.address, [i.batch for i in items], timeout_s
        )

    def retain(self, live: Mapping[str, str]) -> None:
        """Drop the idle lanes of gateways (id and address) no longer live, then tell the
        inner client."""
        for key, lane in list(self._lanes.items()):
            gateway_id, address = key
            if live.get(gateway_id) != address and not lane.in_flight and not lane.queue:
                del self._lanes[key]
        self._inner.retain(live)

    def __len__(self) -> int:
        return len(self._lanes)

    async def close(self) -> None:
        await self._tasks.cancel()
        for lane in self._lanes.values():
            for item in lane.queue:
                if not item.future.done():
                    item.future.set_exception(GatewayUnavailable(lane.gateway_id, "client closed"))
        await self._inner.close()
