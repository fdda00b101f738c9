"""The router's gRPC client of the gateways, as a stack of layers, top to bottom (each
takes the one below; `P2PPusher` calls the top):

1. `CoalescingGatewayClient`: pushes to one gateway that queue behind the calls in
   flight leave together in one DeliverMany (each keeps its reply and deadline).
2. `ResilientGatewayClient`: per-gateway call stats, the circuit breaker, and retries of
   a whole RPC on the same gateway (same batch ids, so never twice).
3. `GrpcGatewayClients`: one carrier per call, the gateway's delivery link
   (router.gateway_rpc.link, opened here in the background) when it is open, else a
   unary DeliverMany on the one grpc.aio channel per gateway address; errors become
   GatewayUnavailable here.

The layers meet at the seams of router.gateway_rpc.base; the delivery link is a module
of its own (router.gateway_rpc.link), as a transport is.

1. Coalescing. At most `max_in_flight` calls per gateway run at once. A call that finds
them all busy queues; when one finishes, everything queued for that gateway (up to
`max_batches`) leaves in one DeliverMany. At low load nothing waits and every push is a
call of its own; under load one RPC carries many pushes, which is what keeps the
per-push cost of gRPC (about 0.2 ms a call on each side) from capping the push rate.

With `per_turn` (the push service's), deliveries also wait for the end of the loop turn
that queued them, and everything queued for a gateway in one turn is one call: pushes
whose Redis replies came in one round trip (router.redis.autopipe) reach that point in
the same turn, so under load they share a call long before the slots run out.

2. Stats, circuit breaking and retries on the same gateway. A P2P call must reach the
gateway the user is connected to, so a failed call is retried there (never on "the next
server"), up to `max_retries_same` times with jittered backoff, and only on a transport
error (UNAVAILABLE: the call never reached the gateway or the connection broke). A
retry resends the same batch, whose batch id the gateway drops if it already delivered
it, so a retry after a lost answer does not deliver twice.

After `failure_threshold` consecutive failures a gateway's circuit opens: calls to it
fail at once for the cool-off, then one probe call decides whether it closes again. The
same StatsRegistry tells dispatch to skip the gateway meanwhile.

Each failed attempt and each failed call is logged (logger `imroute.calls`), and every
attempt is counted in `CallMetrics` (Prometheus series).

3. The carriers: per gateway, its carriers, and one carrier per call. A call goes on the
gateway's delivery link (router.gateway_rpc.link: about a tenth of gRPC's CPU per call)
when one is open, else in a unary DeliverMany on the one grpc.aio channel kept per
gateway address (which also carries the control call `Link`). A single batch is a call
of one. Errors of either carrier become GatewayUnavailable here, named by gRPC status
code; the layer above (2) retries them.

Per gateway address, the link is: open; or being opened by a task (ask the gateway's
gRPC `Link` method for its port and a ticket, connect, hello); or waiting for the time
to try again (a link that could not be opened, or broke, is tried again RETRY_S later,
and after each failure to open one twice as late, up to RETRY_MAX_S); or nothing to
try: a gateway that offers no link (port 0). Until a link is open, calls go in gRPC
DeliverMany calls: nothing waits for a link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry, Counter, Histogram

from router.balancing import RetryPolicy, StatsRegistry
from router.gateway_rpc.base import (
    Batches,
    EachReplies,
    ManyGatewayClient,
    Replies,
)
from router.gateway_rpc.link import DeliveryLink, open_link
from shared.backoff import backoff_s
from shared.errors import GatewayUnavailable
from shared.internal_auth import TlsFiles, token_metadata
from shared.proto import gateway_pb2
from shared.proto.gateway_service import GatewayAsyncStub, GatewayStub
from shared.tasks import Background
from shared.tls_context import client_context

__all__ = [
    "CIRCUIT_CODES",
    "CIRCUIT_OPEN",
    "CLOSE_GRACE_S",
    "MAX_CALL_BYTES",
    "OPEN_TIMEOUT_S",
    "QUEUED_TOO_LONG",
    "RETRY_MAX_S",
    "RETRY_S",
    "TRANSPORT_CODES",
    "CallMetrics",
    "CoalescingGatewayClient",
    "GrpcGatewayClients",
    "ManyGatewayClient",
    "ResilientGatewayClient",
    "host_of",
    "retry_in",
]

log = logging.getLogger(__name__)
# The resilient layer (2) logs failed calls and attempts under a name of their own.
calls_log = logging.getLogger("imroute.calls")


# ---------------------------------------------------------------------- 1. coalescing

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


async def _gather_each(
    deliveries: Sequence[Awaitable[gateway_pb2.DeliverReply]],
) -> EachReplies:
    """Each delivery's reply, or the GatewayUnavailable it failed with (in order); any
    other error is raised."""
    replies: EachReplies = []
    for r in await asyncio.gather(*deliveries, return_exceptions=True):
        if isinstance(r, BaseException) and not isinstance(r, GatewayUnavailable):
            raise r
        replies.append(r)
    return replies


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

    async def deliver_each(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> EachReplies:
        """Every batch queued as a delivery of its own: they leave together, in calls of
        up to max_batches (and max_bytes), within the lane's calls in flight. A batch of
        one, the usual P2P push, goes alone when a slot is free (not per turn)."""
        lane = self._lane(gateway_id, address)
        if len(batches) != 1:
            return await _gather_each(self._queue(lane, batches, timeout_s))
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


# ---------------------------------------------------------------------- 2. stats, circuit, retries

# Worth a retry on the same gateway: the call did not get through. DEADLINE_EXCEEDED is
# not: the push's time is spent.
TRANSPORT_CODES = frozenset({"UNAVAILABLE"})
# What counts against the circuit: the gateway could not be reached, or did not answer
# in time, or refuses our internal token (a gateway we cannot push to must not be given
# clients: dispatch skips an open circuit). An answer with another error
# (INVALID_ARGUMENT, UNIMPLEMENTED, INTERNAL) is not a sign the gateway is down.
CIRCUIT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "UNAUTHENTICATED"})
# The least time an attempt is given (a retry is not tried with less left).
MIN_ATTEMPT_S = 0.005
# The code of the error a call refused by an open circuit raises.
CIRCUIT_OPEN = "CIRCUIT_OPEN"


class ResilientGatewayClient:
    """A ManyGatewayClient wrapper: circuit breaker, stats and same-gateway retries.

    It sits *below* the coalescer, so it sees RPCs, not pushes: a DeliverMany carrying
    50 pushes that fails is one failure for the circuit and one retry (of the whole
    call, with the same batch ids), not 50.
    """

    def __init__(
        self,
        inner: ManyGatewayClient,
        stats: StatsRegistry,
        policy: RetryPolicy,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        metrics: CallMetrics | None = None,
    ) -> None:
        self._inner = inner
        self.stats = stats
        self._policy = policy
        self._sleep = sleep
        # Without one given, the counts go to a registry of their own, which nobody reads.
        self._metrics = metrics or CallMetrics(CollectorRegistry())

    async def deliver_many(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> Replies:
        """Attempts within one deadline (`timeout_s` from now, for all of them)."""
        clock = self.stats.clock
        deadline = clock.monotonic() + timeout_s
        metrics = self._metrics
        extra = {"gateway_id": gateway_id}
        retry = 0
        while True:
            ticket = self.stats.on_start(gateway_id)
            if ticket is None:
                error = GatewayUnavailable(
                    gateway_id,
                    "circuit open: failing fast after repeated failures; "
                    "it is tried again after its cool-off",
                    CIRCUIT_OPEN,
                )
                # The opening was logged once; a line per refused call would flood the
                # log while the gateway is out.
                calls_log.debug("call to gateway %s refused: %s", gateway_id, error, extra=extra)
                metrics.failed(gateway_id)
                raise error
            attempt_started = clock.monotonic()
            try:
                if retry:  # inside the try: whatever it raises, the ticket is released
                    metrics.retried(gateway_id)
                left = max(deadline - attempt_started, MIN_ATTEMPT_S)
                replies = await self._inner.deliver_many(gateway_id, address, batches, left)
            except GatewayUnavailable as exc:
                if exc.code in CIRCUIT_CODES:
                    self.stats.on_failure(ticket)
                else:  # the gateway answered: a refusal or a bug, not a sign it is down
                    self.stats.on_release(ticket)
                calls_log.info(
                    "call to gateway %s failed (attempt %d): %s",
                    gateway_id,
                    retry + 1,
                    exc,
                    extra=extra,
                )
                metrics.attempt_failed(gateway_id)
                backoff = self._policy.backoff(retry + 1)
                if (
                    exc.code not in TRANSPORT_CODES
                    or retry >= self._policy.max_retries_same
                    # no time left for the backoff and a useful attempt after it
                    or deadline - clock.monotonic() < backoff + MIN_ATTEMPT_S
                    # the circuit opened (maybe on this failure): the retry would be
                    # refused; report the failure itself, not the refusal
                    or not self.stats.allow(gateway_id)
                ):
                    calls_log.warning(
                        "delivery to gateway %s failed after %d attempts: %s",
                        gateway_id,
                        retry + 1,
                        exc,
                        extra=extra,
                    )
                    metrics.failed(gateway_id)
                    raise
            except BaseException:
                self.stats.on_release(ticket)  # cancelled, or not the gateway's fault
                raise
            else:
                self.stats.on_success(ticket)
                metrics.succeeded(gateway_id, clock.monotonic() - attempt_started)
                return replies
            retry += 1
            await self._sleep(backoff)

    def retain(self, live: Mapping[str, str]) -> None:
        """Forget the stats, circuits and channels of gateways that left the fleet (a
        gateway that comes back starts with a closed circuit and fresh stats)."""
        self.stats.retain(frozenset(live))
        self._inner.retain(live)

    async def close(self) -> None:
        await self._inner.close()


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class CallMetrics:
    """Calls, retries, failures and latency per gateway, as `ResilientGatewayClient` makes
    them (the push service's /metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._seen: set[str] = set()  # gateways with series
        self._attempts = Counter(
            "imroute_gateway_call_attempts",
            "Delivery calls to a gateway (link or DeliverMany; one may carry many pushes), "
            "by outcome",
            ["gateway", "outcome"],
            registry=registry,
        )
        self._retries = Counter(
            "imroute_gateway_call_retries",
            "RPCs that were retries of an earlier failed one",
            ["gateway"],
            registry=registry,
        )
        self._failed = Counter(
            "imroute_gateway_calls_failed",
            "RPCs that failed for good (after retries, or refused by an open circuit)",
            ["gateway"],
            registry=registry,
        )
        self._latency = Histogram(
            "imroute_gateway_call_seconds",
            "Latency of successful delivery calls (link or DeliverMany)",
            ["gateway"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def retain(self, live: Mapping[str, str]) -> None:
        """Drop the series of gateways that left the fleet: gateway ids that change with
        every deploy (pod names) would otherwise grow /metrics without bound."""
        for gateway in self._seen - live.keys():
            self._seen.discard(gateway)
            for metric, labels in (
                (self._attempts, (gateway, "success")),
                (self._attempts, (gateway, "failure")),
                (self._retries, (gateway,)),
                (self._failed, (gateway,)),
                (self._latency, (gateway,)),
            ):
                with contextlib.suppress(KeyError):
                    metric.remove(*labels)

    def retried(self, gateway: str) -> None:
        """An attempt that retries an earlier failed one starts."""
        self._seen.add(gateway)
        self._retries.labels(gateway).inc()

    def attempt_failed(self, gateway: str) -> None:
        self._seen.add(gateway)
        self._attempts.labels(gateway, "failure").inc()

    def succeeded(self, gateway: str, elapsed_s: float) -> None:
        """The call's last attempt succeeded, after `elapsed_s`."""
        self._seen.add(gateway)
        self._attempts.labels(gateway, "success").inc()
        self._latency.labels(gateway).observe(elapsed_s)

    def failed(self, gateway: str) -> None:
        """The call failed for good (after its retries, or refused by an open circuit)."""
        self._seen.add(gateway)
        self._failed.labels(gateway).inc()


# ---------------------------------------------------------------------- 3. the carriers

# A channel to a gateway that left the fleet is closed; calls still on it get this long.
CLOSE_GRACE_S = 5.0
# How long the gRPC `Link` call (where is the delivery link?) may take.
LINK_ASK_S = 2.0
# Opening a delivery link (connect, TLS, hello) may take this long.
OPEN_TIMEOUT_S = 2.0
# A link that broke or could not be opened is tried again this long after, doubling with
# each failure to open in a row, up to RETRY_MAX_S.
RETRY_S = 5.0
RETRY_MAX_S = 60.0

_CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.keepalive_time_ms", 30_000),
    # gRPC's own reconnect backoff grows to 120 s by default: a gateway that restarts
    # at the same address would stay unreachable long after the circuit breaker (which
    # does the backing off here) lets a probe through. Cap it at 1 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # Each channel its own subchannels: gRPC otherwise shares them process-wide between
    # channels with equal arguments, so the new channel `reconnect` makes for a restarted
    # gateway would inherit the old one's subchannel, still backing off from the crash.
    # One channel per address is kept anyway, so nothing is lost by not sharing.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.max_receive_message_length", 16 << 20),
]


def retry_in(failures: int) -> float:
    """How long after its `failures`-th failure in a row a link is tried again."""
    return backoff_s(failures, RETRY_S, RETRY_MAX_S, rand=None)


def host_of(address: str) -> str:
    """The host of a gRPC address: `10.0.0.5:9101` -> `10.0.0.5`, `[::1]:9101` -> `::1`."""
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


@dataclass(frozen=True, slots=True)
class _Stub:
    channel: grpc.aio.Channel
    rpc: GatewayAsyncStub  # method paths and codecs: shared.proto.gateway_service


class GrpcGatewayClients:
    """Per gateway address: one grpc.aio channel, and a delivery link while one is open;
    errors become GatewayUnavailable."""

    def __init__(
        self,
        close_grace_s: float = CLOSE_GRACE_S,
        token: str | None = None,
        tls: TlsFiles | None = None,
        links: bool = True,
    ) -> None:
        """`token`: the gateways' IMROUTE_INTERNAL_TOKEN, sent with every call; `tls`:
        dial them with mTLS (this side's cert as the client's); `links`: use the
        delivery links the gateways offer (False: every call is a DeliverMany)."""
        self._stubs: dict[str, _Stub] = {}
        self._grace = close_grace_s
        self._closing = Background("closing a channel or a link", log)
        self._metadata = token_metadata(token) if token is not None else None
        self._credentials: grpc.ChannelCredentials | None = None
        self._options = list(_CHANNEL_OPTIONS)
        if tls is not None:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
            )
            if tls.server_name:
                self._options.append(("grpc.ssl_target_name_override", tls.server_name))
        # The delivery links, by gateway address.
        self._links = links
        self._link_tls = None if tls is None or not links else client_context(tls)
        self._link_server_name = None if tls is None else tls.server_name
        self._open: dict[str, DeliveryLink] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}  # those of _linking still asking
        self._linking = Background("opening a delivery link", log)
        self._retry_at: dict[str, float] = {}
        self._no_link: set[str] = set()  # addresses that offer no link
        self._failures: dict[str, int] = {}  # failed opens in a row, per address
        self.links_opened = 0

    def _stub(self, address: str) -> _Stub:
        stub = self._stubs.get(address)
        if stub is None:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=self._options)
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, self._options)
            stub = self._stubs[address] = _Stub(channel, GatewayStub(channel))
        return stub

    async def deliver_many(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> Replies:
        """One call: on the open link, else a DeliverMany. (Calls started together while
        a link opens may be answered out of order, as calls to two push-service workers
        are: a push awaited before the next is sent always arrives first.)"""
        link = self._link(gateway_id, address) if self._links else None
        if link is not None:
            return await link.call(batches, timeout_s)
        request = gateway_pb2.DeliverManyRequest(batches=batches)
        try:
            reply = await self._stub(address).rpc.DeliverMany(
                request, timeout=timeout_s, metadata=self._metadata
            )
        except (grpc.aio.AioRpcError, grpc.aio.BaseError, grpc.RpcError, ValueError) as exc:
            raise _translate(gateway_id, exc) from None
        if len(reply.replies) != len(batches):
            raise GatewayUnavailable(gateway_id, "DeliverMany answered the wrong number of batches")
        return list(reply.replies)

    # ------------------------------------------------------------------ the links

    def _link(self, gateway_id: str, address: str) -> DeliveryLink | None:
        """The open link to `address`, or None (then one is being opened, if it may)."""
        link = self._open.get(address)
        if link is not None:
            if link.usable and link.gateway_id == gateway_id:
                return link
            del self._open[address]
            self._end(link)
            if not link.usable:
                self._retry_at[address] = asyncio.get_running_loop().time() + RETRY_S
        if address in self._no_link or address in self._opening:
            return None
        now = asyncio.get_running_loop().time()
        if now < self._retry_at.get(address, 0.0):
            return None
        self._opening[address] = self._linking.spawn(
            self._open_link(gateway_id, address), f"link-open:{address}"
        )
        return None

    async def _open_link(self, gateway_id: str, address: str) -> None:
        try:
            reply = await self._ask_link(gateway_id, address)
            if reply.port == 0:
                self._no_link.add(address)
                log.info("gateway %s offers no delivery link: calls go over gRPC", gateway_id)
                return
            if reply.gateway_id and reply.gateway_id != gateway_id:
                raise GatewayUnavailable(gateway_id, f"{address} is now {reply.gateway_id}")
            link = await open_link(
                gateway_id,
                host_of(address),
                reply.port,
                reply.ticket,
                OPEN_TIMEOUT_S,
                self._link_tls,
                self._link_server_name,
            )
        except GatewayUnavailable as exc:
            failures = self._failures[address] = self._failures.get(address, 0) + 1
            wait = retry_in(failures)
            self._retry_at[address] = asyncio.get_running_loop().time() + wait
            if failures == 1 or wait >= RETRY_MAX_S:  # at most a line a minute, then
                log.warning(
                    "no delivery link to gateway %s yet (%d tries; calls go over gRPC; "
                    "again in %gs): %s",
                    gateway_id,
                    failures,
                    wait,
                    exc.reason,
                )
            return
        finally:
            if self._opening.get(address) is asyncio.current_task():
                del self._opening[address]
        self.links_opened += 1
        self._retry_at.pop(address, None)
        self._failures.pop(address, None)
        self._open[address] = link

    async def _ask_link(self, gateway_id: str, address: str) -> gateway_pb2.LinkReply:
        try:
            return await self._stub(address).rpc.Link(
                gateway_pb2.LinkRequest(), timeout=LINK_ASK_S, metadata=self._metadata
            )
        except (grpc.aio.AioRpcError, grpc.aio.BaseError, grpc.RpcError, ValueError) as exc:
            raise _translate(gateway_id, exc) from None

    def _end(self, link: DeliveryLink) -> None:
        self._later(link.ended(self._grace), "link-end")

    def _forget_link(self, address: str) -> None:
        """The gateway at `address` left or restarted: its link ends (calls on it get the
        grace), and whether it offers one is asked again."""
        link = self._open.pop(address, None)
        if link is not None:
            self._end(link)
        task = self._opening.pop(address, None)
        if task is not None:
            task.cancel()
            # It ends in `_linking`, which `close()` waits for.
        self._retry_at.pop(address, None)
        self._failures.pop(address, None)
        self._no_link.discard(address)

    def _link_addresses(self) -> set[str]:
        return {*self._open, *self._opening, *self._retry_at, *self._no_link, *self._failures}

    # ------------------------------------------------------------------ the fleet changes

    def retain(self, live: Mapping[str, str]) -> None:
        """Close the channels and links to addresses no live gateway has; calls still on
        them get `close_grace_s` to finish."""
        addresses = set(live.values())
        for address in self._link_addresses() - addresses:
            self._forget_link(address)
        for address in [a for a in self._stubs if a not in addresses]:
            self._close_later(address, self._stubs.pop(address).channel)

    def reconnect(self, address: str) -> None:
        """The gateway at `address` restarted: its next call goes on a new channel. The
        old one may sit in gRPC's reconnect backoff (up to 1 s of failing fast after the
        crash), which would fail the circuit's probe of a gateway that is back up. Calls
        still on the old channel get `close_grace_s` to finish."""
        stub = self._stubs.pop(address, None)
        self._forget_link(address)
        if stub is not None:
            self._close_later(address, stub.channel)

    def _close_later(self, address: str, channel: grpc.aio.Channel) -> None:
        self._later(channel.close(self._grace), f"close:{address}")

    def _later(self, closing: Coroutine[Any, Any, None], name: str) -> None:
        self._closing.spawn(closing, name)

    def __len__(self) -> int:
        return len(self._stubs)

    async def close(self) -> None:
        await self._linking.cancel()
        links = list(self._open.values())
        self._open.clear()
        for link in links:
            link.close()
        stubs = list(self._stubs.values())
        self._stubs.clear()
        for stub in stubs:
            await stub.channel.close()
        await self._closing.drain()  # with those a retain during the awaits above added


def _translate(gateway_id: str, exc: Exception) -> GatewayUnavailable:
    """Every grpc failure (and a bad address) as our error, naming the status code."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code().name
        return GatewayUnavailable(gateway_id, f"{code}: {exc.details()}", code)
    return GatewayUnavailable(gateway_id, f"{type(exc).__name__}: {exc}")
