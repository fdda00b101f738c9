"""Tracing's pieces in-process, with the SDK's InMemorySpanExporter: the push's root span
over HTTP, a hedged publish's attempts, the gateway's delivery and ack spans, the
traceparent both ways, and the settings that turn it on (or stop a start)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import httpx
import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind, TraceState
from opentelemetry.util.types import Attributes
from starlette.types import Receive, Scope, Send

from push_service.tracing_http import TracedRequests, TracerSlot
from router.bus.hedged import traced_attempt
from router.testing import ManualClock
from shared.errors import ConfigError
from shared.proto import gateway_pb2
from shared.settings import Settings, check_tracing
from shared.tracing import TRACEPARENT, parent_context, sampled, traced, traceparent
from shared.tracing_setup import Tracing, open_tracing
from socket_gateway.tracing import MAX_TRACED_PUSHES, GatewayTracing
from tests.unit.hedger_calls import Calls, advance, hedger, start

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exported() -> Iterator[tuple[Tracing, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracing = Tracing.with_exporter(exporter, "test", "t1", batched=False)
    yield tracing, exporter
    tracing.shutdown()


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


# ------------------------------------------------------------------ the request's span


def _app(status: int, tracing: Tracing | None = None) -> TracedRequests:
    """An app answering `status`, behind TracedRequests with `tracing`'s tracer, if any."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    slot = TracerSlot()
    if tracing is not None:
        slot.tracer = tracing.tracer
    return TracedRequests(app, slot)


async def _post(app: TracedRequests, path: str, headers: dict[str, str] | None = None) -> int:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        return (await http.post(path, json={}, headers=headers)).status_code


async def _spans(
    exported: tuple[Tracing, InMemorySpanExporter],
    status: int,
    *requests: tuple[str, dict[str, str] | None],
) -> tuple[ReadableSpan, ...]:
    """The spans that POSTs of `requests` (path, headers) made through an app answering
    `status` behind TracedRequests with `exported`'s tracer."""
    tracing, exporter = exported
    app = _app(status, tracing)
    for path, headers in requests:
        assert await _post(app, path, headers) == status
    return exporter.get_finished_spans()


async def test_a_push_request_is_a_server_span_continuing_the_callers_trace(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    (span,) = await _spans(exported, 200, ("/v1/push", {"traceparent": CALLER}))
    assert span.name == "POST /v1/push" and span.kind.name == "SERVER"
    assert span.context is not None and span.parent is not None
    assert f"{span.context.trace_id:032x}" == CALLER.split("-")[1]
    assert f"{span.parent.span_id:016x}" == CALLER.split("-")[2]
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 200
    assert span.status.status_code.name == "UNSET"


async def test_a_bad_traceparent_starts_a_trace_and_5xx_is_an_error(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    (span,) = await _spans(exported, 503, ("/v1/multicast", {"traceparent": "00-zz-yy-01"}))
    assert span.parent is None  # its own trace
    assert span.status.status_code.name == "ERROR"


async def test_a_4xx_is_the_callers_error_and_other_paths_make_no_span(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    # /v1/users is not a push
    (span,) = await _spans(exported, 422, ("/v1/push/batch", None), ("/v1/users", None))
    assert span.name == "POST /v1/push/batch" and span.status.status_code.name == "UNSET"


class DropRequests(Sampler):
    """Drops every request's root span and samples every other root (a job's)."""

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        drop = name.startswith("POST ")
        return SamplingResult(Decision.DROP if drop else Decision.RECORD_AND_SAMPLE)

    def get_description(self) -> str:
        return "DropRequests"


async def test_a_request_the_sampler_drops_passes_unwrapped_and_nothing_under_it_is_sampled() -> (
    None
):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(DropRequests()))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    seen: list[object] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(traced(slot.tracer))  # what the services and the pusher ask
        seen.append(send)
        # What starts a span of its own under the request (a broadcast's push.job)
        # follows the request's decision rather than sampling afresh.
        assert slot.tracer is not None
        with slot.tracer.start_as_current_span("push.job") as job:
            seen.append(job.is_recording())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    slot = TracerSlot()
    slot.tracer = tracer
    traced_app = TracedRequests(app, slot)
    assert await _post(traced_app, "/v1/push") == 200
    # A caller's sampled-out context is followed too: still nothing.
    assert await _post(traced_app, "/v1/push", {"traceparent": CALLER[:-2] + "00"}) == 200
    assert seen[0] is None and seen[3] is None  # no child span, no context sent on
    assert "sending" not in repr(seen[1])  # its messages pass unwrapped
    assert seen[2] is False and seen[5] is False  # a job's span under it: dropped too
    assert exporter.get_finished_spans() == ()
    # The sampled case still wraps the response (for the status code on its span).
    exporter2 = InMemorySpanExporter()
    tracing = Tracing.with_exporter(exporter2, "s", "i", batched=False)
    slot.tracer = tracing.tracer
    assert await _post(traced_app, "/v1/push") == 200
    assert seen[6] is tracing.tracer and "sending" in repr(seen[7]) and seen[8] is True
    (span,) = _named(exporter2.get_finished_spans(), "POST /v1/push")
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 200
    assert span.attributes["http.route"] == "/v1/push"


async def test_without_a_tracer_the_request_passes_untouched() -> None:
    assert await _post(_app(200), "/v1/push", {"traceparent": CALLER}) == 200


# ------------------------------------------------------------------ a hedged publish


async def test_each_attempt_of_a_hedged_publish_is_a_span_under_the_publish(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported
    clock = ManualClock()
    h, calls = hedger(clock, tokens=5), Calls()
    with tracing.tracer.start_as_current_span("bus.publish") as publish_span:
        publish = await start(h, traced_attempt(tracing.tracer, calls))
    await advance(clock, 1.0)  # the hedge delay: a hedge goes out
    assert calls.hedges == [0, 1]
    calls.answer(1, "m-2")  # the hedge wins; the original is cancelled
    assert await publish == "m-2"
    await asyncio.sleep(0)
    attempts = _named(exporter.get_finished_spans(), "bus.attempt")
    by_n = {s.attributes["imroute.attempt"]: s for s in attempts if s.attributes}
    assert set(by_n) == {0, 1}
    assert by_n[1].attributes is not None and by_n[1].attributes["imroute.outcome"] == "ok"
    assert by_n[1].attributes["imroute.hedge"] is True
    assert by_n[0].attributes is not None and by_n[0].attributes["imroute.outcome"] == "cancelled"
    parent = publish_span.get_span_context().span_id
    assert all(s.parent is not None and s.parent.span_id == parent for s in attempts)


async def test_a_failed_attempt_is_an_error_span(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported
    h, calls = hedger(ManualClock()), Calls()
    publish = await start(h, traced_attempt(tracing.tracer, calls))
    calls.answer(0, RuntimeError("refused"))
    with pytest.raises(RuntimeError):
        await publish
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes["imroute.outcome"] == "failed"
    assert span.status.status_code.name == "ERROR" and span.events[0].name == "exception"


# ------------------------------------------------------------------ the gateway's spans


def _batch(tp: str, push_id: str = "p1") -> gateway_pb2.Batch:
    batch = gateway_pb2.Batch(batch_id="b1", mode=gateway_pb2.MODE_MULTICAST, traceparent=tp)
    batch.message.push_id = push_id
    batch.uids.extend(["u1", "u2"])
    return batch


def test_a_delivery_is_a_span_under_the_batchs_parent_and_acks_under_it(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported
    gt = GatewayTracing(tracing.tracer)
    reply = gateway_pb2.DeliverReply(delivered=["u1"], missing=["u2"])
    gt.delivered(_batch(CALLER), reply, 0)
    gt.acked({"p1": {"u1"}, "unknown": {"u9"}}, written=True)
    gt.acked({"p1": {"u1"}}, written=False)
    deliver, acks, failed = exporter.get_finished_spans()
    assert deliver.name == "gateway.deliver" and deliver.kind.name == "CONSUMER"
    assert deliver.parent is not None and f"{deliver.parent.span_id:016x}" == CALLER.split("-")[2]
    assert deliver.attributes is not None
    assert (deliver.attributes["imroute.written"], deliver.attributes["imroute.missing"]) == (1, 1)
    assert deliver.context is not None
    for span in (acks, failed):
        assert span.name == "gateway.acks" and span.parent is not None
        assert span.parent.span_id == deliver.context.span_id
        assert span.attributes is not None and span.attributes["imroute.acked"] == 1
    assert failed.status.status_code.name == "ERROR"


def test_an_untraced_or_malformed_batch_makes_no_span_and_the_memory_is_bounded(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = exported
    gt = GatewayTracing(tracing.tracer)
    gt.delivered(_batch("not-a-traceparent"), gateway_pb2.DeliverReply(), 0)
    assert exporter.get_finished_spans() == ()
    for i in range(MAX_TRACED_PUSHES + 1):
        gt.delivered(_batch(CALLER, f"p{i}"), gateway_pb2.DeliverReply(delivered=["u1"]), 0)
    exporter.clear()
    gt.acked({"p0": {"u1"}, f"p{MAX_TRACED_PUSHES}": {"u1"}}, written=True)
    (span,) = exporter.get_finished_spans()  # p0, the oldest, was forgotten
    assert span.parent is not None and span.attributes is not None
    assert span.attributes["imroute.acked"] == 1


def test_traceparent_round_trips(exported: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracing, _ = exported
    with tracing.tracer.start_as_current_span("x") as span:
        written = traceparent(span)
    ctx = parent_context({TRACEPARENT: written})
    assert ctx is not None
    assert parent_context({TRACEPARENT: "00-" + "0" * 32 + "-" + "0" * 16 + "-01"}) is None
    assert parent_context({}) is None


# ------------------------------------------------------------------ the settings


def test_off_by_default_and_on_with_an_endpoint() -> None:
    assert open_tracing(Settings.load({}), "s", "i") is None
    tracing = open_tracing(
        Settings.load({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}), "s", "i"
    )
    assert tracing is not None
    tracing.provider.shutdown()  # nothing was made: nothing is sent to the closed port


def test_a_bad_endpoint_or_protocol_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4318'"):
        check_tracing(Settings.load({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}))
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        Settings.load({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    grpc = {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    check_tracing(Settings.load(grpc))  # host:port is what the grpc exporter takes


def test_an_unsampled_push_makes_no_child_spans_and_sends_no_context() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.0)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    assert traced(None) is None
    with tracer.start_as_current_span("POST /v1/push"):
        assert traced(tracer) is None  # dropped by the sampler: nothing under it
    sampled_tracer = Tracing.with_exporter(exporter, "s", "i", batched=False).tracer
    with sampled_tracer.start_as_current_span("POST /v1/push"):
        assert traced(sampled_tracer) is sampled_tracer
    assert sampled(CALLER) and not sampled(CALLER[:-2] + "00") and not sampled("")


def test_the_span_cost_benchmark_builds_a_p2p_push_s_five_spans_as_one_trace(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    from bench.span_cost import one_push

    tracing, exporter = exported
    one_push(tracing, GatewayTracing(tracing.tracer), 7)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {
        "POST /v1/push",
        "routes.lookup",
        "gateway.call",
        "gateway.deliver",
        "gateway.acks",
    }
    ids = {name: s.context.span_id for name, s in spans.items() if s.context is not None}
    parents = {name: s.parent.span_id for name, s in spans.items() if s.parent is not None}
    assert parents == {
        "routes.lookup": ids["POST /v1/push"],
        "gateway.call": ids["POST /v1/push"],
        "gateway.deliver": ids["gateway.call"],
        "gateway.acks": ids["gateway.deliver"],
    }
    assert len({s.context.trace_id for s in spans.values() if s.context is not None}) == 1
