"""The webhook settings (issue 13, README "Webhooks"), a mixin of `shared.settings.Settings`.

Kept apart so the one settings class stays readable; `Settings` inherits every field and
check here, and `Settings.load` reads them as `IMROUTE_WEBHOOK_*` like any other.
"""

from __future__ import annotations

from typing import Self
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

__all__ = ["WebhookSettings"]


class WebhookSettings(BaseSettings):
    """Where the app's server takes its events, and how they are queued and retried."""

    # unset: no webhooks, and nothing is tracked or queued for them. Gateways need it
    # too (they track presence only while it is set); they never call it.
    webhook_url: str | None = Field(None, min_length=8, max_length=2048)
    # the HMAC-SHA256 key requests are signed with; required with the URL, never logged
    webhook_secret: SecretStr | None = None
    # user.offline waits this long for a reconnect (to any gateway) before it is sent
    webhook_offline_grace_s: float = Field(5.0, ge=0, le=3600)
    # events waiting to be delivered, fleet-wide; past it new ones are counted and dropped
    webhook_queue_max: int = Field(100_000, ge=10, le=10_000_000)
    # one POST's deadline in all (connect, send, the answer's head; a few KiB of its body
    # are read, no more), and the most events it carries
    webhook_timeout_s: float = Field(5.0, gt=0, le=60)
    webhook_batch_max: int = Field(100, ge=1, le=1000)
    # retries back off exponentially from 0.5 s up to this
    webhook_backoff_max_s: float = Field(30.0, ge=0.05, le=600)
    # a stored P2P or multicast message no device of a recipient acked this long is a
    # `message.unacked` event (README, "Acks and receipts")
    webhook_unacked_s: float = Field(10.0, ge=1, le=86_400)
    # whether message.unacked events carry the content's first 256 bytes (`preview`)
    webhook_preview: bool = True

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return value

    @model_validator(mode="after")
    def _secret_with_url(self) -> Self:
        if self.webhook_url is not None and self.webhook_secret is None:
            raise ValueError("IMROUTE_WEBHOOK_SECRET is required when IMROUTE_WEBHOOK_URL is set")
        return self
