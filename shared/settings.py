"""Settings, read once at an entry point from `IMROUTE_*` variables and flags."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Self

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.dispatch_settings import DispatchSettings
from shared.errors import ConfigError
from shared.gc_settings import GcSettings
from shared.http_settings import HttpSettings
from shared.keys import ID_PATTERN
from shared.link_settings import LinkSettings
from shared.log_settings import LogSettings
from shared.preauth_settings import PreAuthSettings
from shared.resume_settings import ResumeSettings
from shared.trace_settings import TraceSettings
from shared.urls import redact_url
from shared.webhook_settings import WebhookSettings

__all__ = ["ENV_PREFIX", "Settings", "env_name", "redact_url"]

ENV_PREFIX = "IMROUTE_"


class Settings(
    DispatchSettings,
    HttpSettings,
    WebhookSettings,
    GcSettings,
    LinkSettings,
    PreAuthSettings,
    LogSettings,
    ResumeSettings,
    TraceSettings,
    BaseSettings,
):
    """Every setting of every imroute process; each entry point uses what it needs."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = Field("imroute:", min_length=1, max_length=64)
    # a Redis command (or connect) that takes longer fails, so a hung Redis gives 503s
    # and logged errors, never a request that waits for ever
    redis_timeout_s: float = Field(5.0, gt=0, le=60)
    api_key: SecretStr | None = None
    secret: SecretStr | None = None

    # the bus broadcast and multicast batches travel on; None means Redis Streams on
    # IMROUTE_REDIS_URL (the embedded default)
    bus_url: str | None = None
    # --- issue 12, the bus (no silent loss, content once per push) ---
    # Redis Streams: the bound, in entries, of a topic's stream. Entries a live gateway
    # has not read are kept up to it; past it the oldest are trimmed and counted as lost
    # for each gateway that had not read them (README, "The bus: retention and loss").
    # About 13 KB per 1000-uid batch (content is stored once per push), so the default
    # holds about 130 MB per topic at most, and little while every gateway keeps up
    bus_maxlen: int = Field(10_000, ge=10, le=10_000_000)
    # Redis Streams: a consumer group that has not read for this long belongs to a
    # gateway that is gone: it stops holding entries, and is deleted
    bus_group_idle_s: float = Field(600.0, ge=5, le=7 * 86_400)
    # content of this many bytes or less travels inline in every batch; larger content
    # is stored once per push (`content:{msg_id}`) and batches name it; 65536 keeps all
    # content inline (gateways older than content-once need that during an upgrade)
    bus_content_inline_max: int = Field(1024, ge=0, le=65_536)
    # how long stored content outlives the push's last batch: must cover the recovery
    # window, the Redis Streams group idle time and Pub/Sub's message retention (1 h)
    bus_content_ttl_s: float = Field(3900.0, ge=60, le=30 * 86_400)
    # --- end of the bus block ---
    # Pub/Sub: unacked messages a gateway holds per subscription (flow control)
    bus_max_outstanding: int = Field(100, ge=1, le=10_000)
    # publish hedging (off unless hedge_delay_ms is set): milliseconds or "auto"; the
    # ranges are checked by router.hedging.HedgingSettings when the publisher is built
    hedge_delay_ms: str | None = None
    hedge_max_tokens: int | None = None
    hedge_refill_ratio: float | None = None
    # recovery (README, "Recovery"): how long a client can resume from its `pos`, and
    # the bounds of each store: P2P entries per user, batches per topic, the inbox
    recovery_window_s: float = Field(300.0, ge=1, le=86_400)
    recovery_user_max: int = Field(1000, ge=1, le=100_000)
    recovery_topic_max: int = Field(2000, ge=10, le=1_000_000)
    inbox_ttl_s: float = Field(86_400.0, ge=1, le=30 * 86_400)
    inbox_max: int = Field(100, ge=1, le=100_000)
    # internal calls (push service -> gateway gRPC; shared/internal_auth.py): a shared
    # token sent as call metadata, and/or mutual TLS (all three files, PEM). A gateway on
    # a non-loopback gRPC address refuses to start with neither.
    internal_token: SecretStr | None = None
    grpc_tls_cert: str | None = Field(None, min_length=1)
    grpc_tls_key: str | None = Field(None, min_length=1)
    grpc_tls_ca: str | None = Field(None, min_length=1)
    # the name the push service expects in the gateways' certs, when not their address
    grpc_tls_server_name: str | None = Field(None, min_length=1, max_length=253)
    # issue 13, rate limits (README, "Rate limits"): requests a second per API key to the
    # sending endpoints (POST /v1/push, /v1/broadcast, /v1/multicast), as "<n>/s", shared
    # by every push service through Redis; unset: no limit. The burst defaults to n.
    rate_limit: str | None = Field(None, min_length=3, max_length=32)
    rate_burst: int | None = Field(None, ge=1, le=1_000_000)
    # the user directory broadcast pages through (a SQLAlchemy async URL)
    db_url: str = "sqlite+aiosqlite:///imroute-users.db"

    # push service
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    deliver_timeout_s: float = Field(2.0, gt=0, le=60)
    batch_size: int = Field(1000, ge=1, le=10_000)
    flush_timeout_s: float = Field(1.0, gt=0, le=60)
    gateway_cache_s: float = Field(1.0, ge=0, le=60)
    # P2P calls: retries on the same gateway after UNAVAILABLE, and its circuit breaker
    deliver_retries: int = Field(1, ge=0, le=5)
    circuit_failures: int = Field(5, ge=0, le=1000)  # 0: the circuit never opens
    circuit_cool_off_s: float = Field(10.0, gt=0, le=600)

    # push jobs (issue 12, jobs that survive; README, "Push jobs"): a running job's lease
    # (renewed every third of it; a lapsed one is taken over by another push service), the
    # runs a job gets in all when its processes keep dying, how long a stopping push
    # service lets its jobs finish before it hands them over, and a batch's publish retries
    job_lease_s: float = Field(10.0, ge=0.3, le=600)
    job_max_attempts: int = Field(3, ge=1, le=100)
    job_shutdown_grace_s: float = Field(10.0, ge=0, le=3600)
    job_publish_retries: int = Field(3, ge=0, le=10)
    job_publish_backoff_s: float = Field(0.2, ge=0, le=60)
    # push service HTTP edge (issue 12: credentials before bodies, uvicorn's limits).
    # The admin key alone may drain gateways and write the user directory; without one,
    # IMROUTE_API_KEY keeps both roles.
    admin_api_key: SecretStr | None = None
    # (the HTTP server's own settings: shared.http_settings)

    # --- issue 13, idempotency (README, "Idempotent pushes") ---
    # how long a push's answer is kept for replay under its Idempotency-Key (Stripe: 24 h)
    idempotency_ttl_s: float = Field(86_400.0, ge=1, le=30 * 86_400)
    # the lease of a request still running under a key: a process that dies mid-request
    # frees the key after it. It must outlast the slowest push (P2P is bounded by
    # IMROUTE_DELIVER_TIMEOUT_S, at most 60), or a slow push could be sent twice
    idempotency_lease_s: float = Field(90.0, ge=1, le=600)
    # --- end of the idempotency block ---
    # --- issue 13, receipts (README, "Acks and receipts"); ttl 0: no receipts ---
    receipts_ttl_s: float = Field(86_400.0, ge=0, le=30 * 86_400)
    # pushes with at most this many recipients keep each one's state (and list them)
    receipts_max_recipients: int = Field(10_000, ge=1, le=100_000)
    # --- issue 13, webhook --- the IMROUTE_WEBHOOK_* fields: shared/webhook_settings.py

    # gateway
    gateway_id: str = "gw1"
    group_id: str = "g1"
    ws_host: str = "127.0.0.1"
    ws_port: int = Field(8101, ge=0, le=65535)
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(9101, ge=0, le=65535)
    # the gateway's internal HTTP port for Prometheus (GET /metrics); unset: none
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(None, ge=0, le=65535)
    advertise_host: str | None = None
    ws_public_url: str | None = None
    route_ttl_s: float = Field(60.0, ge=1, le=3600)
    heartbeat_s: float = Field(2.0, ge=0.1, le=600)
    max_write_buffer: int = Field(1 << 20, ge=1024)
    gateway_max_connections: int = Field(100_000, ge=1, le=10_000_000)
    # a drain closes the clients spread over this many seconds, so they do not stampede
    drain_window_s: float = Field(10.0, ge=0, le=3600)
    zone: str | None = Field(None, min_length=1, max_length=64)

    # issue 12, handshake limits and JWT options: what a socket must do before its 101
    # (README, "Connecting: the handshake"), and what a client token must carry
    ws_handshake_timeout_s: float = Field(3.0, gt=0, le=60)  # accept -> request head
    ws_max_pre_auth: int = Field(1000, ge=1, le=1_000_000)  # sockets before their 101
    ws_connect_rate_per_ip: float | None = Field(None, gt=0, le=1_000_000)  # None: off
    ws_connect_burst_per_ip: int = Field(10, ge=1, le=1_000_000)
    jwt_audience: str | None = Field(None, min_length=1, max_length=256)
    jwt_issuer: str | None = Field(None, min_length=1, max_length=256)
    jwt_leeway_s: float = Field(30.0, ge=0, le=3600)
    jwt_max_ttl_s: int = Field(86_400, ge=0, le=366 * 86_400)  # 0: no maximum
    # client limits (issue 12: per-user cap, client frame rate): live connections one
    # user may hold across the fleet (0: no cap), refused past it with close 4429; and
    # each connection's client frames, pings included (rate 0: no limit), closed 1008
    max_connections_per_user: int = Field(10, ge=0, le=1_000_000)
    ws_client_frame_rate: float = Field(20.0, ge=0, le=100_000)
    ws_client_frame_burst: int = Field(50, ge=1, le=1_000_000)

    # dispatch: how GET /v1/dispatch places clients (consistent_hash, round_robin,
    # least_connections, zone_affinity); the rule names are checked by router.balancing
    dispatch_rule: str = "consistent_hash"

    @field_validator("gateway_id", "group_id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not ID_PATTERN.fullmatch(value):
            raise ValueError("must be 1-64 characters of letters, digits, '_', '.' or '-'")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://", "redis+cluster://")):
            raise ValueError("must start with redis://, rediss://, unix:// or redis+cluster://")
        return value

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

    @field_validator("db_url")
    @classmethod
    def _db_url(cls, value: str) -> str:
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError("must be a sqlite+aiosqlite:// or postgresql+asyncpg:// URL")
        return value

    @property
    def effective_bus_url(self) -> str:
        return self.bus_url or self.redis_url

    @field_validator("api_key")
    @classmethod
    def _api_key_len(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return value

    @field_validator("admin_api_key")
    @classmethod
    def _admin_api_key(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is None:
            return value
        if len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        push = info.data.get("api_key")
        if isinstance(push, SecretStr) and push.get_secret_value() == value.get_secret_value():
            # One key in two roles would make the admin scope meaningless.
            raise ValueError("must differ from IMROUTE_API_KEY")
        return value

    @field_validator("secret")
    @classmethod
    def _secret_len(cls, value: SecretStr | None) -> SecretStr | None:
        # RFC 7518 3.2: an HS256 key must be at least as long as the hash (32 bytes).
        if value is not None and len(value.get_secret_value().encode()) < 32:
            raise ValueError("must be at least 32 bytes (an HS256 key, RFC 7518 3.2)")
        return value

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

    @model_validator(mode="after")
    def _idempotency_lease_covers_a_push(self) -> Self:
        if self.idempotency_lease_s <= self.deliver_timeout_s:
            raise ValueError(
                f"IMROUTE_IDEMPOTENCY_LEASE_S ({self.idempotency_lease_s}) must exceed "
                f"IMROUTE_DELIVER_TIMEOUT_S ({self.deliver_timeout_s}): a push still "
                "running when its lease lapses could be sent twice"
            )
        return self

    @model_validator(mode="after")
    def _heartbeat_below_ttl(self) -> Self:
        if self.heartbeat_s * 2 > self.route_ttl_s:
            raise ValueError(
                f"heartbeat_s ({self.heartbeat_s}) must be at most half of "
                f"route_ttl_s ({self.route_ttl_s}) so routes outlive one missed heartbeat"
            )
        return self

    @classmethod
    def load(cls, environ: Mapping[str, str], **overrides: Any) -> Settings:
        """Build settings from `environ` (IMROUTE_*) with `overrides` (flags) on top.

        Raises ConfigError naming the variable when a value is bad.
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
        name = env_name(loc) if loc else "settings"
        problems.append(f"{name}: {err['msg']}")
    return "invalid configuration: " + "; ".join(problems)


def env_name(field: str) -> str:
    """The environment variable of a setting: IMROUTE_<NAME>, but OpenTelemetry's own
    names for its settings (shared.trace_settings)."""
    return field.upper() if field.startswith("otel_") else ENV_PREFIX + field.upper()
