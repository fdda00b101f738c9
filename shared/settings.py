"""Settings, read once at an entry point from `IMROUTE_*` variables and flags.

Each concern is one section class (its fields, their checks and descriptions); each
process reads the sections it uses, composed into its own class:

    FleetSettings     what the gateway and the push service both read (Redis, the bus,
                      recovery, receipts, tokens, internal calls, logs, traces, ...)
    GatewaySettings   FleetSettings + the gateway's sections
    PushSettings      FleetSettings + the push service's sections
    ToolSettings      FleetSettings + the user directory: `imroute keys`
    Settings          all of them, for code that runs both (the dev stack, tests)

The other operator commands read one section each: `imroute token` ClientTokenSettings,
`db` and `users` DirectorySettings. A process never reads, nor checks, a variable it has
no field for. The configuration
reference (docs/reference/configuration.md) is generated from these classes by
scripts/config_reference.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.errors import ConfigError
from shared.keys import ID_PATTERN
from shared.urls import redact_url

__all__ = [
    "ENV_PREFIX",
    "WS_SOURCE",
    "BusSettings",
    "ClientTokenSettings",
    "ConnectionLimitSettings",
    "DirectorySettings",
    "DispatchSettings",
    "EdgeSettings",
    "FanoutSettings",
    "FleetSettings",
    "GatewayCallSettings",
    "GatewayFleetSettings",
    "GatewayServerSettings",
    "GatewaySettings",
    "GcSettings",
    "HandshakeSettings",
    "HttpHeadSettings",
    "HttpServerSettings",
    "InternalCallSettings",
    "LogSettings",
    "PresenceSettings",
    "PushSettings",
    "ReceiptSettings",
    "RecoverySettings",
    "RedisSettings",
    "ResumeSettings",
    "Section",
    "Settings",
    "ToolSettings",
    "TraceSettings",
    "WebhookSettings",
    "check_tracing",
    "default_workers",
    "env_name",
    "misspelled",
    "redact_url",
]

ENV_PREFIX = "IMROUTE_"

# A CSP source a WebSocket may go to: a scheme, or a scheme and host (and port).
WS_SOURCE = re.compile(r"wss?:(//(\*\.)?[A-Za-z0-9.-]+(:([0-9]{1,5}|\*))?)?")
# A browser's Origin header: scheme, host, an optional port; no path, no trailing slash.
ORIGIN = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?", re.IGNORECASE)


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def env_name(field: str) -> str:
    """The environment variable of a setting: IMROUTE_<NAME>, but OpenTelemetry's own
    names for its settings (TraceSettings)."""
    return field.upper() if field.startswith("otel_") else ENV_PREFIX + field.upper()


class Section(BaseSettings):
    """The base of every section and settings class: how they are read and refused."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    @classmethod
    def load(cls, environ: Mapping[str, str], **overrides: Any) -> Self:
        """Build settings from `environ` (IMROUTE_*) with `overrides` (flags) on top.

        Only this class's own variables are read. Raises ConfigError naming the
        variable when a value is bad.
        """
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            key = env_name(name)
            if key in environ:
                values[name] = environ[key]
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        said = err["msg"].removeprefix("Value error, ")
        if loc:  # named once, where a validator's message names it too
            name = env_name(loc)
            problems.append(f"{name}: {said.removeprefix(f'{name}: ')}")
        else:  # a check across settings: its message names the variables
            problems.append(said)
    return "invalid configuration: " + "; ".join(problems)


def _key_of_16(value: SecretStr | None) -> SecretStr | None:
    if value is not None and len(value.get_secret_value()) < 16:
        raise ValueError("must be at least 16 characters")
    return value


# --- sections both the gateway and the push service read ---------------------------


class RedisSettings(Section):
    """Redis, where routes, the fleet, recovery and receipts live."""

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis (`redis://`, `rediss://`, `unix://`, or `redis+cluster://host:port` "
        "for Redis Cluster)",
    )
    redis_prefix: str = Field(
        "imroute:",
        min_length=1,
        max_length=64,
        description="key prefix, so several stacks can share one Redis",
    )
    # a hung Redis gives 503s and logged errors, never a request that waits for ever
    redis_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="a Redis command or connect that takes longer fails: the API answers 503, "
        "the gateway logs it and keeps serving its clients",
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://", "redis+cluster://")):
            raise ValueError("must start with redis://, rediss://, unix:// or redis+cluster://")
        return value


class BusSettings(Section):
    """The bus broadcast and multicast batches travel on, and publish hedging."""

    bus_url: str | None = Field(
        None,
        description="the bus for broadcast and multicast batches: `redis://…` (Redis Streams) "
        "or `pubsub://PROJECT` (Google Cloud Pub/Sub; with `PUBSUB_EMULATOR_HOST` set, the "
        "emulator). Unset: Redis Streams on `IMROUTE_REDIS_URL`. `memory://` is refused here: "
        "it is an in-process bus, and one opened per service would reach no gateway. With "
        "`IMROUTE_REDIS_URL=redis+cluster://…` it is required (exit 2 without it): a gateway "
        "reads its topics' streams in one `XREADGROUP`, which a cluster refuses across slots, "
        "so the bus needs a standalone Redis or Pub/Sub. Code that runs the push service and "
        "gateways in one process passes one `MemoryBus` to `create_app(settings, bus=...)` "
        "and `Gateway(settings, bus=...)`",
    )
    # About 13 KB per 1000-uid batch (content is stored once per push), so the default
    # holds about 130 MB per topic at most, and little while every gateway keeps up.
    bus_maxlen: int = Field(
        10_000,
        ge=10,
        le=10_000_000,
        description="Redis Streams: the bound of a topic's stream, in entries (a 1000-uid "
        "batch is about 13 KB). Entries a live gateway has not read are kept up to it; past "
        "it the oldest go, and each gateway's unread ones are counted as lost (docs, "
        '"The bus: retention and loss")',
    )
    bus_group_idle_s: float = Field(
        600.0,
        ge=5,
        le=7 * 86_400,
        description="Redis Streams: a gateway whose consumer group has read nothing for this "
        "long has left; its group is deleted and holds nothing",
    )
    bus_content_inline_max: int = Field(
        1024,
        ge=0,
        le=65_536,
        description="broadcast and multicast content of more bytes than this is stored once "
        "per push (`content:{msg_id}`), and batches name it; `65536` keeps all content inline "
        "(no content read on delivery or resume)",
    )
    bus_content_ttl_s: float = Field(
        3900.0,
        ge=60,
        le=30 * 86_400,
        description="how long stored content outlives its push's last batch; at least "
        "`IMROUTE_RECOVERY_WINDOW_S` and `IMROUTE_BUS_GROUP_IDLE_S`, and by default past "
        "Pub/Sub's hour of retention",
    )
    bus_max_outstanding: int = Field(
        100,
        ge=1,
        le=10_000,
        description="Pub/Sub: unacked messages a gateway holds per subscription (flow control)",
    )
    # the gateway allows for it when a user moves (how late a batch may still come)
    flush_timeout_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="how long a multicast group buffer's oldest entry may wait before its "
        "batch is published",
    )
    # the ranges are checked by router.hedging.HedgingSettings when the publisher is built
    hedge_delay_ms: str | None = Field(
        None,
        description="hedge bus publishes after this many ms (100-10000, below the 5 s attempt "
        "timeout), or `auto`; unset: no hedging",
    )
    hedge_max_tokens: int | None = Field(
        None,
        description="hedging token bucket size (1-250; unset: 50); needs `IMROUTE_HEDGE_DELAY_MS`",
    )
    hedge_refill_ratio: float | None = Field(
        None,
        description="tokens added per successful publish (0.001-0.2; unset: 0.1): at most "
        "this share of publishes is hedged",
    )

    @field_validator("bus_url")
    @classmethod
    def _bus_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value.startswith("memory://"):
            # An in-process bus opened from a setting would be one bus per service: the
            # push service's batches would reach no gateway. Code that runs both in one
            # process passes the same MemoryBus object to each instead.
            raise ValueError(
                "memory:// is an in-process bus for tests and examples: pass one MemoryBus "
                "to create_app(settings, bus=...) and Gateway(settings, bus=...) instead"
            )
        if not value.startswith(("redis://", "rediss://", "unix://", "pubsub://")):
            raise ValueError("must start with redis://, rediss://, unix:// or pubsub://")
        return value

    @field_validator("hedge_delay_ms", mode="before")
    @classmethod
    def _hedge_delay(cls, value: object) -> object:
        if value is None or value == "auto":
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value.strip()):
            return value.strip()
        raise ValueError("must be a whole number of milliseconds, or auto")


class RecoverySettings(Section):
    """What is kept for resumes (docs, "Recovery"): the window and each store's bound."""

    recovery_window_s: float = Field(
        300.0, ge=1, le=86_400, description="how long a client can resume from its `pos`"
    )
    recovery_user_max: int = Field(
        1000, ge=1, le=100_000, description="P2P messages kept per user for resumes"
    )
    recovery_topic_max: int = Field(
        2000,
        ge=10,
        le=1_000_000,
        description="broadcast or multicast batches kept per topic for resumes",
    )
    inbox_ttl_s: float = Field(
        86_400.0,
        ge=1,
        le=30 * 86_400,
        description="how long a P2P message that reached no connection waits in the inbox",
    )
    inbox_max: int = Field(
        100,
        ge=1,
        le=100_000,
        description="inbox entries per user; the oldest is dropped first, counted and logged",
    )
    inbox_legacy_writes: bool = Field(
        False,
        description="push service: also write each stored P2P message into the user's inbox "
        "as the version before kept it (`uinbox:{uid}`), while push services of that version "
        'still run; off once none does (docs, "Upgrading from a version that kept the '
        'inbox apart")',
    )
    topic_log_legacy_writes: bool = Field(
        False,
        description="push service, on the Redis Streams bus on `IMROUTE_REDIS_URL`: log each "
        "broadcast and multicast batch in the list `topiclog:{topic}`, as the version before "
        "did, rather than as its place in the bus stream, while push services of that version "
        "still run (they trim the stream down to what the gateways read); off once none does "
        '(docs, "Upgrading from a version that logged topics apart")',
    )


class ReceiptSettings(Section):
    """Receipts (docs, "Acks and receipts")."""

    receipts_ttl_s: float = Field(
        86_400.0,
        ge=0,
        le=30 * 86_400,
        description="how long a push's receipt stays readable (`GET /v1/pushes/{push_id}`); "
        "`0` turns receipts (and `wait_ack_ms`) off",
    )
    receipts_max_recipients: int = Field(
        10_000,
        ge=1,
        le=100_000,
        description="pushes with at most this many recipients keep each recipient's state "
        "(exact counts, `/recipients`); larger ones keep counts only",
    )


class ClientTokenSettings(Section):
    """The client JWTs: the key they are signed with and what each must carry."""

    secret: SecretStr | None = Field(
        None,
        description="HS256 key for client JWTs, ≥32 bytes; required by gateways and "
        "`imroute token`, and by the push service for `GET /v1/dispatch` (without it, 503, "
        "warned at its start); the same on every process (`imroute dev` generates one)",
    )
    jwt_audience: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="client tokens must carry this `aud` (a string, or a list holding it); "
        "unset, a token with any `aud` is refused (RFC 7519 §4.1.3)",
    )
    jwt_issuer: str | None = Field(
        None, min_length=1, max_length=256, description="client tokens must carry this `iss`"
    )
    jwt_leeway_s: float = Field(
        30.0, ge=0, le=3600, description="clock skew allowed on `exp`, `nbf` and `iat`"
    )
    jwt_max_ttl_s: int = Field(
        86_400,
        ge=0,
        le=366 * 86_400,
        description="longer-lived tokens are refused: `exp - iat`, or `exp - now` without "
        "`iat` (`0`: no maximum). Gateways and `GET /v1/dispatch` apply all four "
        "`IMROUTE_JWT_*` alike",
    )

    @field_validator("secret")
    @classmethod
    def _secret_len(cls, value: SecretStr | None) -> SecretStr | None:
        # RFC 7518 3.2: an HS256 key must be at least as long as the hash (32 bytes).
        if value is not None and len(value.get_secret_value().encode()) < 32:
            raise ValueError("must be at least 32 bytes (an HS256 key, RFC 7518 3.2)")
        return value


class InternalCallSettings(Section):
    """Calls from the push service to the gateways (docs, "Internal calls", "The
    delivery link"): the carrier, and the credentials (shared/internal_auth.py)."""

    delivery_link: bool = Field(
        True,
        description="gateway: offer the delivery link; push service: use the links gateways "
        'offer; `false` on either: every delivery call goes over gRPC ("The delivery link")',
    )
    internal_token: SecretStr | None = Field(
        None,
        description="the push service's credential on the gateways' gRPC ports, ≥32 printable "
        "characters; required by a gateway whose gRPC listens beyond loopback unless mTLS is "
        'on ("Internal calls"); unset by default (`imroute dev` generates one)',
    )
    grpc_tls_cert: str | None = Field(
        None,
        min_length=1,
        description="mutual TLS for gateway gRPC: this process's cert chain (PEM file); with "
        "`IMROUTE_GRPC_TLS_KEY` and `IMROUTE_GRPC_TLS_CA`, all three or none; unset: no TLS",
    )
    grpc_tls_key: str | None = Field(
        None, min_length=1, description="mutual TLS: this process's private key (PEM file)"
    )
    grpc_tls_ca: str | None = Field(
        None,
        min_length=1,
        description="mutual TLS: the CA that signs the other side's cert (PEM file)",
    )
    grpc_tls_server_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="with mTLS: the name the push service expects in the gateways' certs; "
        "unset: the address dialled",
    )

    @field_validator("internal_token")
    @classmethod
    def _internal_token_len(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        token = value.get_secret_value()
        if len(token) < 32:
            raise ValueError("must be at least 32 characters (e.g. openssl rand -hex 32)")
        if not token.isascii() or not token.isprintable() or " " in token:
            raise ValueError("must be printable ASCII without spaces (it travels as gRPC metadata)")
        return value

    @model_validator(mode="after")
    def _tls_all_or_none(self) -> Self:
        files = {
            "IMROUTE_GRPC_TLS_CERT": self.grpc_tls_cert,
            "IMROUTE_GRPC_TLS_KEY": self.grpc_tls_key,
            "IMROUTE_GRPC_TLS_CA": self.grpc_tls_ca,
        }
        missing = [name for name, path in files.items() if path is None]
        if 0 < len(missing) < len(files):
            raise ValueError(f"mTLS needs all three files: {', '.join(missing)} not set")
        return self


class HttpHeadSettings(Section):
    """How large a request head every HTTP listener takes (shared.http_heads): the push
    service, a gateway's WebSocket and metrics ports. docs/operations/security-review.md."""

    http_max_head_bytes: int = Field(
        16 * 1024,
        ge=1024,
        le=1 << 20,
        description="every HTTP listener (the push service, a gateway's WebSocket and metrics "
        "ports): a request head (request line, header fields, blank line) over this many "
        "bytes is answered 431 `headers_too_large` and its connection closed (above "
        "`IMROUTE_HTTP_MAX_URL_BYTES`; docs/operations/security-review.md)",
    )
    http_max_headers: int = Field(
        100,
        ge=8,
        le=128,
        description="... a head with more header fields: 431 `too_many_headers` (at most 128: "
        "the gateway's WebSocket library takes no more)",
    )
    http_max_url_bytes: int = Field(
        8000,
        ge=256,
        le=8000,
        description="... a request target (path and query) over this many bytes: 414 "
        "`uri_too_long` (at most 8,000: the library takes no request line over 8 KiB); "
        "`GET /v1/dispatch` refuses (422) a token that would make the longest URL a client "
        "builds, `/ws?token=<token>&since=<position>`, longer",
    )

    @model_validator(mode="after")
    def _url_fits_in_a_head(self) -> Self:
        if self.http_max_url_bytes >= self.http_max_head_bytes:
            raise ValueError(
                f"IMROUTE_HTTP_MAX_URL_BYTES ({self.http_max_url_bytes}) must be less than "
                f"IMROUTE_HTTP_MAX_HEAD_BYTES ({self.http_max_head_bytes}): the request "
                "line is part of the head"
            )
        return self


class PresenceSettings(Section):
    """What gateways track for the webhook's user.online / user.offline events."""

    webhook_url: str | None = Field(
        None,
        min_length=8,
        max_length=2048,
        description="the app's own server, `http://` or `https://`: every push service POSTs "
        'the fleet\'s events here (docs, "Webhooks"). Set it on gateways too: they track '
        "presence for `user.offline`/`user.online` only while it is set (they never call it). "
        "Unset: no webhooks, and nothing is tracked or queued",
    )
    webhook_offline_grace_s: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="`user.offline` waits this long for a reconnect, to any gateway, before it "
        "is sent (the same on every process)",
    )
    webhook_queue_max: int = Field(
        100_000,
        ge=10,
        le=10_000_000,
        description="events waiting for delivery, fleet-wide; past it new events are refused, "
        "counted (`imroute_webhook_overflowed_total`) and logged",
    )

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value


class LogSettings(Section):
    """How every process logs (shared.logs)."""

    log_level: str = Field("info", description="`debug`, `info`, `warning`, `error`")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`text`: one human line per record; `json`: every line a process writes "
        "is one JSON object, with push_id, msg_id, batch_id and gateway_id wherever they "
        'apply (docs, "Logs")',
    )

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return value.lower()


class TraceSettings(Section):
    """Where traces go (shared.tracing).

    OpenTelemetry's own variable names, not IMROUTE_ ones: they are what every collector's
    and SDK's docs tell an operator to set. The exporters read the rest of theirs
    themselves (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _CERTIFICATE, ...), the SDK its
    sampler (OTEL_TRACES_SAMPLER, _ARG) and batching (OTEL_BSP_*).
    """

    otel_exporter_otlp_endpoint: str | None = Field(
        None,
        validation_alias=AliasChoices("otel_exporter_otlp_endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        min_length=1,
        description="tracing on: the OTLP collector's base URL (`http://host:4318`; spans go "
        'to `/v1/traces`), or `host:4317` with grpc (docs, "Traces"); unset: no tracing',
    )
    otel_exporter_otlp_protocol: Literal["http/protobuf", "grpc"] = Field(
        "http/protobuf",
        validation_alias=AliasChoices("otel_exporter_otlp_protocol", "OTEL_EXPORTER_OTLP_PROTOCOL"),
        description="`http/protobuf` or `grpc`",
    )
    otel_service_name: str | None = Field(
        None,
        validation_alias=AliasChoices("otel_service_name", "OTEL_SERVICE_NAME"),
        min_length=1,
        description="the `service.name` of a process's spans; unset: `imroute-push-service` or "
        "`imroute-gateway` (`service.instance.id` tells processes apart); the SDK's other "
        "`OTEL_*` variables apply as upstream documents them",
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


# --- the gateway's sections ----------------------------------------------------------


class GatewayServerSettings(Section):
    """The gateway's identity, its listening ports and the addresses it announces."""

    gateway_id: str = Field(
        "gw1", description="gateway identity (letters, digits, `_.-`, at most 64)"
    )
    group_id: str = Field(
        "g1", description="the gateway's group (letters, digits, `_.-`, at most 64)"
    )
    zone: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="the gateway's zone, for `zone_affinity` (`--zone`); unset: none",
    )
    ws_host: str = Field("127.0.0.1", description="gateway WebSocket bind address")
    ws_port: int = Field(8101, ge=0, le=65535, description="gateway WebSocket port")
    grpc_host: str = Field(
        "127.0.0.1",
        description='gateway gRPC (and delivery link) bind address; `""`: every interface',
    )
    grpc_port: int = Field(9101, ge=0, le=65535, description="gateway gRPC port")
    link_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="the delivery link's port, on `IMROUTE_GRPC_HOST`; `0`: any free port. "
        "Push services learn it from the gRPC `Link` method, so set it only where a firewall "
        "must name it",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="bind address of the gateway's internal HTTP port for Prometheus",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="the gateway's internal HTTP port for Prometheus (`GET /metrics` only; "
        "`0` picks a free port); unset: none. Bind it where only the scraper reaches",
    )
    advertise_host: str | None = Field(
        None,
        description="address the router reaches this gateway at (and clients, without "
        "`IMROUTE_WS_PUBLIC_URL`). Unset: each port's bind address; for a wildcard bind "
        "(`0.0.0.0`, `::`), this host's one address beyond loopback (where it has several, the "
        "one its name resolves to), else the gateway refuses to start (exit 2). A loopback one "
        "while a port listens beyond loopback is a warning (`socket_gateway/advertise.py`)",
    )
    ws_public_url: str | None = Field(
        None,
        description="URL clients are told to use; unset: `ws://<advertise host>:<ws port>/ws`",
    )

    @field_validator("gateway_id", "group_id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not ID_PATTERN.fullmatch(value):
            raise ValueError("must be 1-64 characters of letters, digits, '_', '.' or '-'")
        return value


class GatewayFleetSettings(Section):
    """How a gateway keeps its place in the fleet: routes, heartbeats, drains."""

    route_ttl_s: float = Field(
        60.0, ge=1, le=3600, description="lifetime of a route without a heartbeat"
    )
    heartbeat_s: float = Field(
        2.0,
        ge=0.1,
        le=600,
        description="fleet heartbeat; the fleet record lives 3 heartbeats; must be ≤ route TTL / 2",
    )
    drain_window_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="a drain closes the gateway's clients spread over this window, so they do "
        "not reconnect all at once",
    )

    @model_validator(mode="after")
    def _heartbeat_below_ttl(self) -> Self:
        if self.heartbeat_s * 2 > self.route_ttl_s:
            raise ValueError(
                f"IMROUTE_HEARTBEAT_S ({self.heartbeat_s}) must be at most half of "
                f"IMROUTE_ROUTE_TTL_S ({self.route_ttl_s}) so routes outlive one missed "
                "heartbeat"
            )
        return self


class ConnectionLimitSettings(Section):
    """What a gateway allows its connected clients (docs, "Client limits")."""

    max_write_buffer: int = Field(
        1 << 20, ge=1024, description="unsent bytes after which a slow client is aborted"
    )
    gateway_max_connections: int = Field(
        100_000,
        ge=1,
        le=10_000_000,
        description="a gateway refuses more clients with HTTP 503 and `Retry-After` at the "
        "handshake (`--max-connections`)",
    )
    max_connections_per_user: int = Field(
        10,
        ge=0,
        le=1_000_000,
        description="live connections one uid may hold across the fleet; a new one past it is "
        "closed 4429 with a reason naming the cap (`0`: no cap)",
    )
    ws_client_frame_rate: float = Field(
        20.0,
        ge=0,
        le=100_000,
        description="frames per second a client connection may send on average; pings and "
        "pongs count; past it, close 1008 (`0`: no limit)",
    )
    ws_client_frame_burst: int = Field(
        50,
        ge=1,
        le=1_000_000,
        description="frames a client connection may send at once before "
        "`IMROUTE_WS_CLIENT_FRAME_RATE` applies",
    )


class HandshakeSettings(Section):
    """What a socket must do before its 101 (docs, "Connecting: the handshake";
    docs/operations/security-review.md, "Sockets before a 101")."""

    ws_handshake_timeout_s: float = Field(
        3.0,
        gt=0,
        le=60,
        description="a socket that has not sent its whole request head this long after its "
        "accept is cut (slowloris); counted",
    )
    ws_request_line_timeout_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="a socket that has not sent its request line this long after its accept "
        "is cut (a silent socket); counted with the above",
    )
    ws_max_pre_auth: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="sockets a gateway holds that have not had their 101; with all taken, a "
        "newcomer from an address holding fewer than the biggest holder takes the place of "
        "that holder's oldest, one from the biggest holder is closed at once; counted and "
        "logged (one line per 10 s)",
    )
    # A handshake takes a round trip or two, so this many at once is an office's clients
    # behind one NAT address all reconnecting in the same instant, or a load test's
    # handshakes in flight; a quarter of the pool, which the eviction of the biggest
    # holder's oldest keeps fair when it is full (docs/operations/security-review.md).
    ws_max_pre_auth_per_ip: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="of those, sockets one address (IPv4, IPv6 /64) may hold, from its accept; "
        "more from it are closed at once, counted. Behind a load balancer, raise it to "
        "`IMROUTE_WS_MAX_PRE_AUTH` (every client has the balancer's address)",
    )
    ws_connect_rate_per_ip: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="connects per second per client address (IPv4 address, IPv6 /64), a token "
        "bucket; over it HTTP 429 with `Retry-After`; unset: off. Behind a load balancer every "
        'client has the balancer\'s address: see docs, "Connecting"',
    )
    ws_connect_burst_per_ip: int = Field(
        10,
        ge=1,
        le=1_000_000,
        description="the bucket's size: connects an address may open at once before the rate "
        "applies",
    )


class ResumeSettings(Section):
    """What one resume may read (docs, "Recovery: positions, `since`, the inbox"; why:
    docs/operations/security-review.md, "What one resume may read")."""

    # The bytes are about what a gateway keeps of a topic in memory (64 batches of 1000
    # uids), the batches half of IMROUTE_RECOVERY_TOPIC_MAX's default.
    recovery_resume_max: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="batches behind a topic log's head one resume may read; a position "
        "further back reads nothing of that log: `complete:false`",
    )
    recovery_resume_max_bytes: int = Field(
        1 << 20,
        ge=1024,
        le=1 << 30,
        description="bytes of a topic log's entries one resume may read from Redis (what the "
        "gateway's memory holds is not counted); read backward from the head, the read stops "
        "at the first entry past it: nothing of that log for the resume, `complete:false`",
    )
    # One every 2 s keeps a phone on a flapping network whole; each resume's read is
    # bounded anyway.
    recovery_resume_rate_per_uid: float = Field(
        0.5,
        ge=0,
        le=1_000_000,
        description="resumes (connects with `since`) per second per user on one gateway, a "
        "token bucket (`0`: no limit); past it no topic log is read (the user's own P2P log "
        "is, from its position) and the resume is `complete:false`",
    )
    recovery_resume_burst_per_uid: int = Field(
        20,
        ge=1,
        le=1_000_000,
        description="the resume bucket's size: resumes a user may make at once before "
        "`IMROUTE_RECOVERY_RESUME_RATE_PER_UID` applies",
    )


class GcSettings(Section):
    """How the gateway keeps the cycle collector off its connections (shared.gc_policy;
    docs, "Garbage collection")."""

    gc_freeze_s: float = Field(
        5.0,
        ge=0,
        le=86_400,
        description="a gateway hides what has lived this long (its connections) from the cycle "
        "collector (`gc.freeze`), so collections do not stall it in proportion to its "
        'connections; `0`: only at start-up (docs, "Garbage collection")',
    )
    gc_full_s: float = Field(
        900.0,
        ge=0,
        le=86_400,
        description="a gateway's one full collection of everything, this many seconds apart, "
        "which frees what closed connections left in reference cycles; `0`: never (their "
        "memory stays until the process ends)",
    )


# --- the push service's sections -----------------------------------------------------


class HttpServerSettings(Section):
    """How the push service serves HTTP: its address, uvicorn's limits, load shedding,
    workers."""

    host: str = Field("127.0.0.1", description="push service bind address")
    port: int = Field(8080, ge=0, le=65535, description="push service port")
    http_header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="a request head must be whole this long after the connection opens or the "
        "next request's first byte, else 408 and the connection closes (slowloris heads are "
        "cut)",
    )
    http_keepalive_timeout_s: int = Field(
        5,
        ge=1,
        le=3600,
        description="an idle keep-alive connection to the push service is closed after this "
        "many seconds (whole seconds)",
    )
    http_max_concurrency: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="open connections or running requests at which the push service answers "
        "503 (uvicorn's `limit_concurrency`), per worker",
    )
    http_max_in_flight: int = Field(
        500,
        ge=1,
        le=1_000_000,
        description="requests a push-service process handles at once; the next is answered 503 "
        "`overloaded` with `Retry-After` (the operator's views and health are not counted nor "
        'shed; docs, "Load shedding")',
    )
    http_max_lag_ms: int = Field(
        1000,
        ge=0,
        le=60_000,
        description="event-loop lag past which a process with 8 or more requests in flight "
        "answers new ones 503 `overloaded` (`0`: lag never sheds)",
    )
    dashboard_connect_src: str = Field(
        "ws: wss:",
        min_length=3,
        max_length=1000,
        description="where the dashboard's test client may open WebSockets (its "
        "Content-Security-Policy `connect-src`, besides `'self'`): the default takes any "
        "gateway; name the gateways' origins to hold it to them, e.g. "
        "`wss://*.push.example.com` (`ws:`/`wss:` sources only; "
        "docs/operations/security-review.md)",
    )
    cors_origins: str = Field(
        "",
        max_length=4000,
        description="origins (`https://chat.example.com`, commas or spaces between them; `*`: "
        "any) whose pages may import `/client/imroute.js` and call `/v1/dispatch`, the two "
        "things the browser client needs; no other endpoint answers a browser on another "
        'origin; unset: the push service\'s own origin only (docs, "The browser client")',
    )
    workers: int = Field(
        default_factory=default_workers,
        ge=1,
        le=256,
        description='push-service processes sharing its one port (docs, "Deployment": '
        "workers); unset: the cores the process may use (`sched_getaffinity`)",
    )

    @field_validator("dashboard_connect_src")
    @classmethod
    def _ws_sources(cls, value: str) -> str:
        for source in value.split():
            if not WS_SOURCE.fullmatch(source):
                raise ValueError(
                    f"IMROUTE_DASHBOARD_CONNECT_SRC: {source[:80]!r} is not a WebSocket source "
                    "(ws: or wss:, or ws[s]://host[:port], the host may start with *.)"
                )
        return " ".join(value.split())

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: str) -> str:
        origins = [o for o in re.split(r"[,\s]+", value.strip()) if o]
        for origin in origins:
            if origin != "*" and not ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"IMROUTE_CORS_ORIGINS: {origin[:80]!r} is not an origin: "
                    "http[s]://host[:port], without a path or a trailing slash, or *"
                )
        if "*" in origins and len(origins) > 1:
            raise ValueError("IMROUTE_CORS_ORIGINS: * (any origin) stands alone")
        # As browsers send an Origin: lower case, without the scheme's default port.
        lowered = (o.lower() for o in origins)
        return " ".join(
            o.removesuffix(":80") if o.startswith("http:") else o.removesuffix(":443")
            for o in lowered
        )


class EdgeSettings(Section):
    """Who may call the push service and how often, and replays (docs, "Keys and
    limits at the HTTP edge", "Idempotent pushes")."""

    api_key: SecretStr | None = Field(
        None,
        description="the callers' bearer key (the push role), ≥16 chars; required by the push "
        "service (`imroute dev` generates one)",
    )
    # validated after api_key, which it must differ from
    admin_api_key: SecretStr | None = Field(
        None,
        description="the bearer key for drains and user-directory writes, and only those; ≥16 "
        "chars, not the API key. Unset: `IMROUTE_API_KEY` holds the admin role too",
    )
    rate_limit: str | None = Field(
        None,
        min_length=3,
        max_length=32,
        description="requests a second per API key to the sending endpoints (`POST /v1/push`, "
        "`/v1/broadcast`, `/v1/multicast`), as `<n>/s` (over 0, at most 1,000,000); shared "
        "through Redis by every push service; unset: no limit",
    )
    rate_burst: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="requests a key may send at once before the rate applies; unset: `n` (one "
        "second's worth)",
    )
    idempotency_ttl_s: float = Field(
        86_400.0,
        ge=1,
        le=30 * 86_400,
        description="how long a push's answer is kept for replay under its `Idempotency-Key`",
    )
    # a process that dies mid-request frees the key after it
    idempotency_lease_s: float = Field(
        90.0,
        ge=1,
        le=600,
        description="how long a request still running holds its `Idempotency-Key` before "
        "another may run it (above `IMROUTE_DELIVER_TIMEOUT_S`)",
    )

    @field_validator("api_key")
    @classmethod
    def _api_key_len(cls, value: SecretStr | None) -> SecretStr | None:
        return _key_of_16(value)

    @field_validator("admin_api_key")
    @classmethod
    def _admin_api_key(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is None:
            return value
        _key_of_16(value)
        push = info.data.get("api_key")
        if isinstance(push, SecretStr) and push.get_secret_value() == value.get_secret_value():
            # One key in two roles would make the admin scope meaningless.
            raise ValueError("must differ from IMROUTE_API_KEY")
        return value


class GatewayCallSettings(Section):
    """The push service's calls to gateways (docs, "Calls to gateways")."""

    deliver_timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="deadline of each call to a gateway (on the delivery link or a gRPC "
        "DeliverMany); a P2P batch without `ttl_s` expires at its end (250 ms early)",
    )
    deliver_retries: int = Field(
        1,
        ge=0,
        le=5,
        description="P2P: retries on the same gateway after `UNAVAILABLE` (same batch id, so "
        "never delivered twice)",
    )
    circuit_failures: int = Field(
        5,
        ge=0,
        le=1000,
        description="consecutive failed calls that open a gateway's circuit (`0`: never)",
    )
    circuit_cool_off_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="how long a gateway's open circuit stays open before one probe call",
    )
    gateway_cache_s: float = Field(
        1.0, ge=0, le=60, description="how long the push service caches the live fleet"
    )


class DispatchSettings(Section):
    """How `GET /v1/dispatch` places clients (docs, "Placing clients")."""

    # the rule names are checked by router.balancing
    dispatch_rule: str = Field(
        "consistent_hash",
        description="how `/v1/dispatch` places clients: `consistent_hash`, `round_robin`, "
        "`least_connections`, `zone_affinity`",
    )
    dispatch_skip_window_s: float = Field(
        30.0,
        gt=0,
        le=600,
        description="dispatch skips a gateway with at least `IMROUTE_DISPATCH_SKIP_MIN_FAILURES` "
        "failed connects (clients' `?avoid=` reports) in the last this many seconds, more than "
        "`IMROUTE_DISPATCH_SKIP_RATIO` times its successful connects there, while another can "
        "take the client (at most the ten minutes the fleet's counts are kept)",
    )
    dispatch_skip_min_failures: int = Field(
        5,
        ge=0,
        le=1_000_000,
        description="failed connects that let dispatch skip a gateway (`0`: never skips)",
    )
    dispatch_skip_ratio: float = Field(
        1.0,
        ge=0,
        le=1000,
        description="how many times its successful connects a gateway's failed ones must be "
        "for dispatch to skip it",
    )


class FanoutSettings(Section):
    """Broadcast and multicast: pages and batches, and the jobs that run them (docs,
    "Push jobs")."""

    batch_size: int = Field(
        1000,
        ge=1,
        le=10_000,
        description="uids per broadcast page and per multicast group batch",
    )
    job_lease_s: float = Field(
        10.0,
        ge=0.3,
        le=600,
        description="a running push job's lease, renewed every third of it; once it lapses "
        "another push service takes the job over",
    )
    job_max_attempts: int = Field(
        3,
        ge=1,
        le=100,
        description="runs a broadcast gets in all when its push services keep dying",
    )
    job_shutdown_grace_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="how long a stopping push service lets running jobs finish before it hands "
        "broadcasts over",
    )
    job_publish_retries: int = Field(
        3,
        ge=0,
        le=10,
        description="accepted and no longer used: a job batch's publish is retried by "
        "the bus itself, up to 60 s (one retry layer per hop); the push service warns when "
        "it is set",
    )
    job_publish_backoff_s: float = Field(
        0.2,
        ge=0,
        le=60,
        description="accepted and no longer used, as `IMROUTE_JOB_PUBLISH_RETRIES`",
    )


class WebhookSettings(Section):
    """How the push service delivers the webhook's events (docs, "Webhooks"); the URL
    and the queue are in PresenceSettings, which the gateways read too."""

    webhook_secret: SecretStr | None = Field(
        None,
        description="the HMAC-SHA256 key requests are signed with, ≥16 chars; required with "
        "`IMROUTE_WEBHOOK_URL`; never logged",
    )
    webhook_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="one POST's deadline in all: connect, send, the answer's head; no answer by "
        "then is retried. At most 4 KiB of an answer's body are read",
    )
    webhook_batch_max: int = Field(100, ge=1, le=1000, description="events per POST at most")
    webhook_backoff_max_s: float = Field(
        30.0,
        ge=0.05,
        le=600,
        description="retries back off exponentially from 0.5 s up to this, with jitter",
    )
    webhook_unacked_s: float = Field(
        10.0,
        ge=1,
        le=86_400,
        description="a stored P2P or multicast message no device of a recipient acked within "
        'this long is a `message.unacked` event (needs receipts on; docs, "Acks and '
        'receipts")',
    )
    webhook_preview: bool = Field(
        True,
        description="whether `message.unacked` carries `preview` (the content's JSON, cut to "
        "256 bytes); `false`: `null`, and receipts keep no content",
    )

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_secret(cls, value: SecretStr | None) -> SecretStr | None:
        return _key_of_16(value)


class DirectorySettings(Section):
    """The user directory broadcast pages through."""

    db_url: str = Field(
        "sqlite+aiosqlite:///imroute-users.db",
        description="the user directory (a SQLAlchemy async URL): `sqlite+aiosqlite:///path` "
        "or `postgresql+asyncpg://user@host/db`; `imroute dev` uses `.imroute/users.db`",
    )

    @field_validator("db_url")
    @classmethod
    def _db_url(cls, value: str) -> str:
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError("must be a sqlite+aiosqlite:// or postgresql+asyncpg:// URL")
        return value


# --- each process's settings ---------------------------------------------------------


class FleetSettings(
    TraceSettings,
    LogSettings,
    PresenceSettings,
    HttpHeadSettings,
    InternalCallSettings,
    ClientTokenSettings,
    ReceiptSettings,
    RecoverySettings,
    BusSettings,
    RedisSettings,
):
    """What the gateway and the push service both read; most must be alike on every
    process of one fleet (the Redis prefix, the bus, recovery, receipts, presence)."""

    @property
    def effective_bus_url(self) -> str:
        return self.bus_url or self.redis_url

    @property
    def topic_log_on_bus(self) -> bool:
        """Whether each bus topic's stream is its recovery log too: the Redis Streams bus
        on the Redis the recovery store uses (IMROUTE_BUS_URL unset, or that URL)."""
        return self.effective_bus_url == self.redis_url and not self.redis_url.startswith(
            "redis+cluster://"
        )

    @model_validator(mode="after")
    def _content_outlives_its_readers(self) -> Self:
        needed = max(self.recovery_window_s, self.bus_group_idle_s)
        if self.bus_content_ttl_s < needed:
            raise ValueError(
                f"IMROUTE_BUS_CONTENT_TTL_S ({self.bus_content_ttl_s}) must be at least "
                f"IMROUTE_RECOVERY_WINDOW_S and IMROUTE_BUS_GROUP_IDLE_S ({needed}): a "
                "batch still owed to a gateway or a resuming client must find its content"
            )
        return self


class GatewaySettings(
    GcSettings,
    ResumeSettings,
    HandshakeSettings,
    ConnectionLimitSettings,
    GatewayFleetSettings,
    GatewayServerSettings,
    FleetSettings,
):
    """What `imroute gateway` (socket_gateway) reads."""


class PushSettings(
    DirectorySettings,
    WebhookSettings,
    FanoutSettings,
    DispatchSettings,
    GatewayCallSettings,
    EdgeSettings,
    HttpServerSettings,
    FleetSettings,
):
    """What `imroute push-service` (push_service) reads."""

    @model_validator(mode="after")
    def _secret_with_url(self) -> Self:
        if self.webhook_url is not None and self.webhook_secret is None:
            raise ValueError("IMROUTE_WEBHOOK_SECRET is required when IMROUTE_WEBHOOK_URL is set")
        return self

    @model_validator(mode="after")
    def _idempotency_lease_covers_a_push(self) -> Self:
        # P2P is bounded by IMROUTE_DELIVER_TIMEOUT_S: a shorter lease could send a slow
        # push twice.
        if self.idempotency_lease_s <= self.deliver_timeout_s:
            raise ValueError(
                f"IMROUTE_IDEMPOTENCY_LEASE_S ({self.idempotency_lease_s}) must exceed "
                f"IMROUTE_DELIVER_TIMEOUT_S ({self.deliver_timeout_s}): a push still "
                "running when its lease lapses could be sent twice"
            )
        return self


class ToolSettings(DirectorySettings, FleetSettings):
    """What `imroute keys` reads: it moves a fleet's keys, so it must agree with its
    processes on Redis, recovery, receipts and the bus's stored content; and it pages the
    user directory. (`imroute token` reads ClientTokenSettings, `db` and `users`
    DirectorySettings.)"""


class Settings(GatewaySettings, PushSettings, ToolSettings):
    """Every setting of every imroute process: for code that runs them all (the dev
    stack, tests)."""


# How alike a variable's name must be to a setting's to be taken for a slip of it: one
# letter wrong, missing or swapped in a name of ten letters or more (the tests' and
# tools' own IMROUTE_ variables stay below it).
SLIP = 0.9


def misspelled(environ: Mapping[str, str]) -> list[str]:
    """What to say of each IMROUTE_ variable in `environ` that no setting has but one is
    a slip away from: a typo is otherwise read as nothing, and the default stands."""
    known = {env_name(name) for name in Settings.model_fields}
    said = []
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            near = difflib.get_close_matches(name, known, n=1, cutoff=SLIP)
            if near:
                said.append(f"{name} is no setting of imroute, and is ignored: {near[0]}?")
    return said
