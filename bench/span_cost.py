"""What one traced P2P push's spans cost in-process, through imroute's own tracing code
and the official SDK (docs/benchmarks/index.md, "Tracing"): the floor under tracing's CPU
per push, whatever the rest of the push costs.

A traced P2P push makes five spans: the request's root (push_service.tracing_http, with
the ids and counts the service adds), `routes.lookup` and `gateway.call` (leaf spans,
shared.tracing.leaf_span), and on its gateway `gateway.deliver` and `gateway.acks`
(socket_gateway.tracing, from the batch's traceparent). This builds them as those
modules do, ends them into the SDK's BatchSpanProcessor, and then encodes them as the
OTLP exporter does (its own encoder), so each step's CPU is measured apart:

    .venv/bin/python -m bench.span_cost --pushes 20000

It prints one JSON object: microseconds of CPU (time.process_time) per span or per
push for each step. Run it on a quiet machine; it sends nothing anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from shared.proto import gateway_pb2
from shared.tracing import SpanKind, leaf_span, parent_context, traceparent, use_span
from shared.tracing_setup import Tracing
from socket_gateway.tracing import GatewayTracing

ROOT_ATTRIBUTES = {"http.request.method": "POST", "http.route": "/v1/push"}


class Keep(SpanExporter):
    """Counts what the batch processor hands over, and keeps the first `limit` spans for
    the encoding step (keeping them all would make every garbage collection walk them,
    which a real exporter, done with each batch, does not)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        if len(self.spans) < self.limit:
            self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def one_push(tracing: Tracing, gateway: GatewayTracing, i: int) -> None:
    """A P2P push's five spans, as the push service and its gateway make them."""
    tracer = tracing.tracer
    root = tracer.start_span("POST /v1/push", kind=SpanKind.SERVER, attributes=ROOT_ATTRIBUTES)
    with use_span(root, end_on_exit=True):
        push_id = f"{i:032x}"
        root.set_attributes(
            {"imroute.push_id": push_id, "imroute.msg_id": push_id, "imroute.recipients": 1}
        )
        with leaf_span(tracer, "routes.lookup", attributes={"imroute.recipients": 1}) as span:
            span.set_attribute("imroute.routes", 1)
        attributes = {"imroute.gateway_id": "gw1"}
        with leaf_span(tracer, "gateway.call", SpanKind.CLIENT, attributes) as call:
            batch = gateway_pb2.Batch(
                batch_id=push_id,
                message=gateway_pb2.Message(push_id=push_id),
                uids=["u1"],
                mode=gateway_pb2.MODE_P2P,
                traceparent=traceparent(call),
            )
            start_ns = time.time_ns()
            gateway.delivered(batch, gateway_pb2.DeliverReply(delivered=["u1"]), start_ns)
            call.set_attributes({"imroute.delivered": 1, "imroute.missing": 0})
        root.set_attribute("http.response.status_code", 200)
        root.set_attribute("imroute.delivered", 1)
    gateway.acked({push_id: {"u1"}}, True)


def per(n: int, work: Callable[[], None]) -> float:
    """Microseconds of this process's CPU per one of `n`."""
    start = time.process_time()
    work()
    return (time.process_time() - start) / n * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pushes", type=int, default=20000)
    args = p.parse_args(argv)
    n: int = args.pushes

    kept = Keep(limit=10_000)
    # Batched as in production (the exporter's thread wakes per 512 spans); its export
    # here only keeps them, so this step is the SDK's own span work.
    tracing = Tracing.with_exporter(kept, "imroute-bench", "b1")
    gateway = GatewayTracing(tracing.tracer)
    for i in range(1000):  # warm-up: imports, caches, the processor's thread
        one_push(tracing, gateway, i)
    tracing.provider.force_flush()
    kept.spans.clear()
    kept.count = 0

    def pushes() -> None:
        for i in range(n):
            one_push(tracing, gateway, i)

    traced = per(n, pushes)
    tracing.provider.force_flush()
    spans = kept.spans
    per_push_spans = kept.count / n

    def encode() -> None:
        for at in range(0, len(spans), 512):  # the exporter's batches
            encode_spans(spans[at : at + 512]).SerializeToString()

    encoded = per(len(spans), encode)
    spans.clear()

    dropped_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.0)))
    dropped_tracer = dropped_provider.get_tracer("imroute")

    def dropped() -> None:
        for _ in range(n):
            span = dropped_tracer.start_span(
                "POST /v1/push", kind=SpanKind.SERVER, attributes=ROOT_ATTRIBUTES
            )
            if not span.is_recording():
                with use_span(span):  # still current, as push_service.tracing_http does
                    pass

    unsampled = per(n, dropped)
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

    def reads() -> None:
        for _ in range(n):
            parent_context(carrier)

    read = per(n, reads)
    tracing.shutdown()
    print(
        json.dumps(
            {
                "pushes": n,
                "spans_per_push": round(per_push_spans, 2),
                "sdk_us_per_traced_push": round(traced, 1),
                "sdk_us_per_span": round(traced / per_push_spans, 1),
                "otlp_encode_us_per_span": round(encoded, 1),
                "us_per_traced_push_all_in": round(traced + encoded * per_push_spans, 1),
                "us_per_unsampled_push": round(unsampled, 1),
                "us_per_traceparent_read": round(read, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
