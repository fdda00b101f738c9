"""How every process logs, a mixin of `shared.settings.Settings` (`IMROUTE_LOG_*`)."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator
from pydantic_settings import BaseSettings

__all__ = ["LogSettings"]


class LogSettings(BaseSettings):
    """See shared.logs."""

    log_level: str = "info"
    # text: one human line per record; json: one JSON object per line, with push_id,
    # msg_id, batch_id and gateway_id wherever they apply (shared.logs)
    log_format: Literal["text", "json"] = "text"

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return value.lower()
