"""Load shedding's decision (push_service.admission) with a hand-moved clock: the
in-flight bound, the event loop's lag (smoothed, or overdue now), and whose requests are
never shed."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.types import Message, Receive, Scope, Send

from push_service.admission import (
    IN_FLIGHT,
    LAG,
    LAG_MIN_IN_FLIGHT,
    AccessRules,
    Admission,
    ApiKeys,
    LimiterSlot,
    LoopLag,
    Shedder,
    is_operator,
)
from push_service.tracing_http import TracerSlot
from shared.clock import ManualClock
from shared.tracing_setup import Tracing


def test_past_the_in_flight_bound_the_next_is_refused() -> None:
    shedder = Shedder(max_in_flight=3, max_lag_ms=2000)
    shedder.in_flight = 2
    assert shedder.refuse() is None
    shedder.in_flight = 3
    assert shedder.refuse() == IN_FLIGHT
    assert "IMROUTE_HTTP_MAX_IN_FLIGHT" in shedder.describe(IN_FLIGHT)


def test_lag_sheds_only_with_requests_in_flight_and_counts_an_overdue_wake_up_at_once() -> None:
    clock = ManualClock(mono=100.0)
    lag = LoopLag(clock.monotonic)
    shedder = Shedder(max_in_flight=1000, max_lag_ms=200, lag=lag)
    lag.due = clock.mono + 0.05  # the measuring task sleeps until then
    shedder.in_flight = LAG_MIN_IN_FLIGHT
    assert shedder.refuse() is None
    clock.advance(0.4)  # the loop is stuck: the task is 0.35 s overdue right now
    assert lag.now_s() == pytest.approx(0.35)
    assert shedder.refuse() == LAG
    assert "IMROUTE_HTTP_MAX_LAG_MS" in shedder.describe(LAG)
    # A lone stall, with few requests in flight, is not overload.
    shedder.in_flight = LAG_MIN_IN_FLIGHT - 1
    assert shedder.refuse() is None


def test_the_lag_is_smoothed_and_decays() -> None:
    lag = LoopLag(ManualClock(mono=100.0).monotonic)
    lag.measured(0.9)
    assert lag.smoothed_s == pytest.approx(0.3)
    for _ in range(10):
        lag.measured(0.0)
    assert lag.smoothed_s < 0.01


def test_lag_zero_never_sheds() -> None:
    lag = LoopLag(ManualClock(mono=100.0).monotonic)
    lag.measured(10.0)
    shedder = Shedder(max_in_flight=1000, max_lag_ms=0, lag=lag)
    shedder.in_flight = 500
    assert shedder.refuse() is None


@pytest.mark.parametrize(
    ("method", "path", "operator"),
    [
        ("GET", "/healthz", True),
        ("GET", "/metrics", True),
        ("GET", "/dashboard/", True),
        ("GET", "/dashboard/dashboard.js", True),
        ("GET", "/client/imroute.js", True),
        ("GET", "/v1/admin/overview", True),
        ("GET", "/v1/gateways", True),
        ("POST", "/v1/gateways/gw1/drain", True),
        ("GET", "/openapi.json", True),
        ("POST", "/v1/push", False),
        ("POST", "/v1/broadcast", False),
        ("GET", "/v1/pushes/abc", False),
        ("GET", "/v1/dispatch", False),
        ("PUT", "/v1/users", False),
        ("POST", "/healthz", False),
    ],
)
def test_whose_requests_are_never_shed(method: str, path: str, operator: bool) -> None:
    assert is_operator(method, path) is operator


@pytest.mark.parametrize(
    ("headers", "closes"),
    [
        ([(b"content-length", b"40")], False),  # skipped by the server, the connection kept
        ([(b"content-length", str(1 << 20).encode())], True),  # not worth reading
        ([(b"transfer-encoding", b"chunked")], True),
        ([], False),
    ],
)
async def test_a_shed_request_is_answered_before_the_app_and_closes_only_for_a_large_body(
    headers: list[tuple[bytes, bytes]], closes: bool
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("a shed request reaches no app")

    shedder = Shedder(max_in_flight=1, max_lag_ms=0)
    shedder.in_flight = 1
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/push", "headers": headers}

    async def receive() -> Message:
        raise AssertionError("a shed request's body is not read")

    no_keys = AccessRules({}, [])
    gate = Admission(app, shedder, ApiKeys("k" * 20), no_keys, LimiterSlot(), 1 << 20)
    await gate(scope, receive, send)
    start = sent[0]
    assert start["status"] == 503
    assert (b"retry-after", b"1") in start["headers"]
    assert ((b"connection", b"close") in start["headers"]) is closes
    assert shedder.shed[IN_FLIGHT] == 1


async def _answered(gate: Admission, scope: Scope) -> int:
    """The status `gate` answers a bodiless request of `scope` with."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    await gate(scope, receive, send)
    return int(sent[0]["status"])


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def test_the_operators_requests_are_told_by_the_routes_path_under_a_root_path() -> None:
    shedder = Shedder(max_in_flight=1, max_lag_ms=0)
    shedder.in_flight = 1  # full: the next request of the API is shed
    gate = Admission(_ok, shedder, ApiKeys("k" * 20), AccessRules({}, []), LimiterSlot(), 1024)
    for root in ("", "/imroute"):
        scope = {"type": "http", "method": "GET", "path": f"{root}/healthz", "root_path": root}
        assert await _answered(gate, {**scope, "headers": []}) == 200
        push = {"type": "http", "method": "POST", "path": f"{root}/v1/push", "root_path": root}
        assert await _answered(gate, {**push, "headers": []}) == 503
    assert shedder.shed[IN_FLIGHT] == 2


async def test_with_tracing_on_a_shed_request_makes_no_span_and_an_admitted_one_does() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing.with_exporter(exporter, "test", "t1", batched=False)
    slot = TracerSlot()
    slot.tracer = tracing.tracer
    shedder = Shedder(max_in_flight=1, max_lag_ms=0)
    keys = ApiKeys("k" * 20)
    gate = Admission(_ok, shedder, keys, AccessRules({}, []), LimiterSlot(), 1024, traced=slot)
    push = {"type": "http", "method": "POST", "path": "/v1/push", "headers": []}
    try:
        shedder.in_flight = 1
        assert await _answered(gate, push) == 503
        assert exporter.get_finished_spans() == ()
        shedder.in_flight = 0
        assert await _answered(gate, push) == 200
        (span,) = exporter.get_finished_spans()
        assert span.name == "POST /v1/push"
    finally:
        tracing.shutdown()
