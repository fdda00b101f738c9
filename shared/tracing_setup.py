"""A process's OpenTelemetry SDK (shared.tracing): the tracer provider, its OTLP
exporter as OTEL_EXPORTER_OTLP_* say (shared.settings.TraceSettings), and its shutdown.

Imported only where tracing is on (the SDK takes about 0.25 s to import, and every
process would pay it at start)."""

from __future__ import annotations

import logging

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from shared.settings import TraceSettings, check_tracing
from shared.tracing import Tracer
from shared.urls import redact_url

__all__ = ["FLUSH_MS", "SCOPE", "Tracing", "open_tracing"]

log = logging.getLogger(__name__)

SCOPE = "imroute"  # the instrumentation scope of every span
# At shutdown, what is left is sent for at most this long (a collector that is down
# must not hold a stopping process for the exporter's full retry budget).
FLUSH_MS = 3000


class Tracing:
    """A process's tracer provider, its tracer, and the shutdown that sends what is left."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer(SCOPE)

    @classmethod
    def with_exporter(
        cls, exporter: SpanExporter, service: str, instance: str, *, batched: bool = True
    ) -> Tracing:
        """Spans of `service` (instance `instance`) to `exporter`: batched in a background
        thread, or (`batched=False`, tests with the SDK's InMemorySpanExporter) at once."""
        resource = Resource.create({"service.name": service, "service.instance.id": instance})
        provider = TracerProvider(resource=resource)
        processor: SpanProcessor = (
            BatchSpanProcessor(exporter) if batched else SimpleSpanProcessor(exporter)
        )
        provider.add_span_processor(processor)
        return cls(provider)

    def shutdown(self) -> None:
        """Send the spans still waiting (for FLUSH_MS at most), then stop. Blocking: call
        it from a thread in async code."""
        if not self.provider.force_flush(FLUSH_MS):
            log.warning("tracing: spans still waiting after %d ms were not sent", FLUSH_MS)
        self.provider.shutdown()


def open_tracing(settings: TraceSettings, service: str, instance: str) -> Tracing | None:
    """The process's tracing, exporting over OTLP; None when no endpoint is set (off).
    ConfigError names the variable when the endpoint cannot be used."""
    check_tracing(settings)
    endpoint = settings.otel_exporter_otlp_endpoint
    if endpoint is None:
        return None
    name = settings.otel_service_name or service
    exporter: SpanExporter
    if settings.otel_exporter_otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        exporter = GrpcExporter(endpoint=endpoint)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    log.info(
        "tracing on: spans of %s go to %s (%s)",
        name,
        redact_url(endpoint),
        settings.otel_exporter_otlp_protocol,
    )
    return Tracing.with_exporter(exporter, name, instance)
