"""The root span of each push's trace (shared.tracing): one SERVER span per request to a
push endpoint, continuing the caller's trace when its request carries a `traceparent`.

Pure ASGI, run by the gates (`push_service.admission`) past their load check, so the span
covers the other refusals (a 401, 429 or 413 is on the record) while a request shed
costs nothing more; installed only when tracing is on: off, requests never meet it.
The services add the push's ids to it (`imroute.push_id`, ...).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.tracing import SpanKind, Status, StatusCode, Tracer, parent_context, use_span

__all__ = ["TRACED_PATHS", "TracedRequests", "TracerSlot"]

# What starts a push: every span below them belongs to one of these.
TRACED_PATHS = frozenset({"/v1/push", "/v1/push/batch", "/v1/broadcast", "/v1/multicast"})
_ATTRIBUTES = {path: {"http.request.method": "POST", "http.route": path} for path in TRACED_PATHS}


class TracerSlot:
    """Where the app's lifespan puts the tracer once tracing is open."""

    tracer: Tracer | None = None


class TracedRequests:
    def __init__(self, app: ASGIApp, slot: TracerSlot) -> None:
        self.app = app
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        tracer = self.slot.tracer
        if tracer is None or path not in TRACED_PATHS or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in (b"traceparent", b"tracestate")
        }
        span = tracer.start_span(
            f"POST {path}",
            context=parent_context(carrier),
            kind=SpanKind.SERVER,
            attributes=_ATTRIBUTES[path],
        )
        if not span.is_recording():
            # The sampler dropped this push (at 1 % sampling, 99 requests of 100): its
            # messages pass unwrapped. Still current, so that what starts under it (a
            # job's span) follows its decision, and nothing below it makes a span or
            # sends a context on (shared.tracing.traced).
            with use_span(span):
                await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    # 4xx is the caller's error, not the server's (semantic conventions).
                    span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            await send(message)

        with use_span(span, end_on_exit=True):  # an exception leaving it is recorded
            await self.app(scope, receive, sending)
