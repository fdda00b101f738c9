"""Where traces go, a mixin of `shared.settings.Settings` (shared.tracing).

OpenTelemetry's own variable names, not IMROUTE_ ones: they are what every collector's
and SDK's docs tell an operator to set. The exporters read the rest of theirs
themselves (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _CERTIFICATE, ...), the SDK its
sampler (OTEL_TRACES_SAMPLER, _ARG) and batching (OTEL_BSP_*).
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings

from shared.errors import ConfigError

__all__ = ["TraceSettings", "check_tracing"]


class TraceSettings(BaseSettings):
    """See shared.tracing."""

    # tracing is on when this is set: the OTLP collector's base URL
    # (http/protobuf: spans go to {endpoint}/v1/traces; grpc: host:port or a URL)
    otel_exporter_otlp_endpoint: str | None = Field(
        None,
        validation_alias=AliasChoices("otel_exporter_otlp_endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        min_length=1,
    )
    otel_exporter_otlp_protocol: Literal["http/protobuf", "grpc"] = Field(
        "http/protobuf",
        validation_alias=AliasChoices("otel_exporter_otlp_protocol", "OTEL_EXPORTER_OTLP_PROTOCOL"),
    )
    # the service.name of every span a process sends; by default imroute-push-service
    # or imroute-gateway (service.instance.id tells processes apart)
    otel_service_name: str | None = Field(
        None, validation_alias=AliasChoices("otel_service_name", "OTEL_SERVICE_NAME"), min_length=1
    )


def check_tracing(settings: TraceSettings) -> None:
    """Refuse, before anything starts, an endpoint the exporter could not use
    (ConfigError naming the variable)."""
    endpoint = settings.otel_exporter_otlp_endpoint
    if (
        endpoint is not None
        and settings.otel_exporter_otlp_protocol == "http/protobuf"
        and not endpoint.startswith(("http://", "https://"))
    ):
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT: {endpoint[:80]!r} is not an http:// or "
            "https:// URL (OTEL_EXPORTER_OTLP_PROTOCOL is http/protobuf)"
        )
