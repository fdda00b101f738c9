"""A `google.pubsub.v1.Publisher` server whose latency and errors a test chooses per call.

Only the Publish RPC, served by grpc.aio through a generic handler with the proto-plus
types' own serialize and deserialize (no code generation). It records every call: its
topic, its `x-goog-pubsub-client-telemetry` header (decoded), when it started and
ended, and whether the client cancelled it. The real google-cloud-pubsub async client
talks to it over real gRPC (`PubSubBus(..., endpoint=server.address)`).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import grpc.aio
from google.pubsub_v1 import PublishRequest, PublishResponse, PubsubClientTelemetry

__all__ = ["Behaviour", "Call", "LatencyPublisher"]

# Spelled out here, not imported from router.bus.pubsub: the fake checks the real name.
TELEMETRY_HEADER = "x-goog-pubsub-client-telemetry"


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What one call does: wait `delay_s`, then answer, or fail with `error`."""

    delay_s: float = 0.0
    error: grpc.StatusCode | None = None


@dataclass(slots=True)
class Call:
    index: int
    topic: str
    data: list[bytes]
    hedged_attempt_count: int | None  # None: no telemetry header
    publish_start_ms: int | None
    started: float
    ended: float | None = None
    cancelled: bool = False
    answered: bool = False
    message_id: str | None = None


@dataclass
class LatencyPublisher:
    """Start with `async with`; `plan(call)` decides each call's Behaviour."""

    plan: Callable[[Call], Behaviour] = field(default=lambda call: Behaviour())
    calls: list[Call] = field(default_factory=list)
    address: str = ""
    _server: grpc.aio.Server | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def __aenter__(self) -> LatencyPublisher:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "google.pubsub.v1.Publisher",
            {
                "Publish": grpc.unary_unary_rpc_method_handler(
                    self._publish,
                    request_deserializer=PublishRequest.deserialize,
                    response_serializer=PublishResponse.serialize,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        self.address = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)

    @property
    def attempts(self) -> list[int | None]:
        """Each call's hedged attempt count, in arrival order."""
        return [c.hedged_attempt_count for c in self.calls]

    async def _publish(
        self, request: PublishRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> PublishResponse:
        count, start_ms = _telemetry(context)
        call = Call(
            index=len(self.calls),
            topic=request.topic,
            data=[m.data for m in request.messages],
            hedged_attempt_count=count,
            publish_start_ms=start_ms,
            started=time.monotonic(),
        )
        self.calls.append(call)
        behaviour = self.plan(call)
        try:
            await asyncio.sleep(behaviour.delay_s)
        except asyncio.CancelledError:
            # grpc.aio cancels the handler when the client cancels the call.
            call.cancelled = True
            call.ended = time.monotonic()
            raise
        call.ended = time.monotonic()
        if behaviour.error is not None:
            await context.abort(behaviour.error, f"injected {behaviour.error.name}")
        call.answered = True
        call.message_id = f"m{next(self._ids)}"
        return PublishResponse(message_ids=[call.message_id] * len(request.messages))


def _telemetry(
    context: grpc.aio.ServicerContext[object, object],
) -> tuple[int | None, int | None]:
    for key, value in context.invocation_metadata() or ():
        if key == TELEMETRY_HEADER:
            raw = value.encode() if isinstance(value, str) else value
            telemetry = PubsubClientTelemetry.deserialize(base64.b64decode(raw))
            op = telemetry.publish_operation
            start = op.publish_start_time
            start_ms = int(start.timestamp() * 1000) if start else None
            return op.hedged_attempt_count, start_ms
    return None, None
