"""The gateway's spans of a push's trace (shared.tracing): one `gateway.deliver` per
batch it delivers, under the router's span the batch names (`Batch.traceparent`: a P2P
call's, or the bus publish's, copied from the message attribute), and one
`gateway.acks` per push and ack flush, under that push's delivery.

Only batches that carry a trace context get spans: a gateway never starts traces of
its own, so an untraced push service means no spans here, whatever this side says.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import Mapping, Set
from contextlib import AsyncExitStack

from opentelemetry.context import Context
from opentelemetry.trace import set_span_in_context

from shared.proto import gateway_pb2
from shared.settings import GatewaySettings
from shared.tracing import (
    TRACEPARENT,
    AttributeValue,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    parent_context,
)

__all__ = ["MAX_TRACED_PUSHES", "GatewayTracing", "gateway_tracing"]

# Pushes whose delivery span is kept for their acks' spans; past it the oldest go (their
# later acks are not traced: counts elsewhere still have them).
MAX_TRACED_PUSHES = 4096


class GatewayTracing:
    """Makes the gateway's spans, and remembers recent pushes' delivery spans."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self._pushes: OrderedDict[str, Context] = OrderedDict()

    def delivered(
        self, batch: gateway_pb2.Batch, reply: gateway_pb2.DeliverReply, start_ns: int
    ) -> None:
        """The span of one delivered batch, from `start_ns` to now."""
        parent = parent_context({TRACEPARENT: batch.traceparent})
        if parent is None:
            return
        m = batch.message
        p2p = batch.mode == gateway_pb2.MODE_P2P
        # Few attributes, and false flags left out: each costs CPU on every traced batch
        # (the gateway is service.instance.id; the push's ids are on the trace's root).
        attributes: dict[str, AttributeValue] = {
            "imroute.batch_id": batch.batch_id,
            "imroute.written": len(reply.delivered) or reply.connections,
            "imroute.missing": len(reply.missing),
        }
        if reply.expired:
            attributes["imroute.expired"] = True
        if reply.duplicate:
            attributes["imroute.duplicate"] = True
        span = self.tracer.start_span(
            "gateway.deliver",
            context=parent,
            kind=SpanKind.SERVER if p2p else SpanKind.CONSUMER,
            start_time=start_ns,
            attributes=attributes,
        )
        span.end()
        if m.push_id and not reply.duplicate:
            pushes = self._pushes
            pushes[m.push_id] = set_span_in_context(span)
            pushes.move_to_end(m.push_id)
            if len(pushes) > MAX_TRACED_PUSHES:
                pushes.popitem(last=False)

    def acked(self, by_push: Mapping[str, Set[str]], written: bool) -> None:
        """One span per traced push of an ack flush: how many of its recipients acked,
        and whether the flush was written (else its acks wait for the next one)."""
        for push_id, uids in by_push.items():
            parent = self._pushes.get(push_id)
            if parent is None:
                continue
            span = self.tracer.start_span(
                "gateway.acks", context=parent, attributes={"imroute.acked": len(uids)}
            )
            if not written:
                span.set_status(Status(StatusCode.ERROR, "the ack flush failed; retried"))
            span.end()


async def gateway_tracing(
    stack: AsyncExitStack, settings: GatewaySettings
) -> GatewayTracing | None:
    """The gateway's tracing when OTEL_EXPORTER_OTLP_ENDPOINT is set (its spans sent when
    `stack` closes), else None."""
    if settings.otel_exporter_otlp_endpoint is None:
        return None
    from shared.tracing_setup import open_tracing  # the SDK, only when on

    instance = settings.gateway_id or f"pid-{os.getpid()}"
    tracing = open_tracing(settings, "imroute-gateway", instance)
    if tracing is None:
        return None
    stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
    return GatewayTracing(tracing.tracer)
