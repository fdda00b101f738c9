"""OpenTelemetry traces of each push's journey, through the official SDK: on when
OTEL_EXPORTER_OTLP_ENDPOINT is set (shared.settings.TraceSettings), off otherwise. Off, no span
is built anywhere: each entry point builds its `Tracing` (or None) once, and every part
that makes spans holds a `Tracer | None` and skips them on None.

One trace per push; spans per batch and per gateway, never per recipient:

    push service
      POST /v1/push, /v1/push/batch,     SERVER    the root (continues the caller's trace
        /v1/broadcast, /v1/multicast               when its request has a traceparent);
                                                   imroute.push_id, .msg_id, .mode, and
                                                   event `acks` (wait_ack_ms)
      routes.lookup                      INTERNAL  imroute.recipients, imroute.routes
      gateway.call                       CLIENT    one per gateway (and try): imroute.
                                                   gateway_id, .batches, .delivered,
                                                   .missing, .expired; error status
      push.job                           INTERNAL  a broadcast's or multicast's run: its
                                                   counters when it ends
      bus.publish                        PRODUCER  one per batch: imroute.batch_id, .topic,
                                                   .recipients
      bus.attempt                        CLIENT    its original, retries and hedges:
                                                   imroute.attempt (0: the original),
                                                   .hedge, .outcome (won, lost, failed)
    gateway
      gateway.deliver                    SERVER    one per batch: imroute.written,
                                         CONSUMER  .missing, .expired, .duplicate
      gateway.acks                       INTERNAL  per push and ack flush: imroute.acked

This module is what the parts that make spans use (the OpenTelemetry API only);
`shared.tracing_setup` builds a process's SDK provider and exporter.

The context travels as W3C `traceparent`: the HTTP header in; `Batch.traceparent` on
P2P batches (a call may carry many pushes' batches; a gateway also takes a DeliverMany's
gRPC metadata for batches without one); the bus message attribute `traceparent` on
broadcast and multicast batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, use_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

__all__ = [
    "TRACEPARENT",
    "AttributeValue",
    "Span",
    "SpanKind",
    "Status",
    "StatusCode",
    "Tracer",
    "current_span",
    "leaf_span",
    "parent_context",
    "sampled",
    "traced",
    "traceparent",
    "use_span",
]

TRACEPARENT = "traceparent"

_PROPAGATOR = TraceContextTextMapPropagator()


def current_span() -> Span:
    """The span of the running task's context (a no-op one when there is none)."""
    return trace.get_current_span()


def traced(tracer: Tracer | None) -> Tracer | None:
    """`tracer` if the running task's span is being recorded (its trace was sampled),
    else None: under a push the sampler dropped, no child span is made (each would cost
    CPU for nothing) and no context travels on, so the gateways make none either."""
    if tracer is not None and trace.get_current_span().is_recording():
        return tracer
    return None


def sampled(traceparent: str) -> bool:
    """Whether a W3C traceparent's trace was sampled (its flags' lowest bit)."""
    return traceparent[-1:] in ("1", "3", "5", "7", "9", "b", "d", "f")


def traceparent(span: Span) -> str:
    """The W3C traceparent naming `span` as the parent (what the propagator writes)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent_context(headers: Mapping[str, str]) -> Context | None:
    """The context a carrier's `traceparent` (and `tracestate`) names; None when it has
    none, or a malformed one (the span then starts a trace of its own)."""
    if TRACEPARENT not in headers:
        return None
    ctx = _PROPAGATOR.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


@contextmanager
def leaf_span(
    tracer: Tracer,
    name: str,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Iterator[Span]:
    """A span for the block that is not made current (nothing is made under it, and
    attaching one costs CPU on every traced push); an exception leaving the block is
    recorded on it as an error."""
    span = tracer.start_span(name, kind=kind, attributes=attributes)
    try:
        yield span
    except Exception as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        span.end()
