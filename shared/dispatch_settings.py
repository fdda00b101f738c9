"""How dispatch learns from clients, a mixin of `shared.settings.Settings` (read as
`IMROUTE_*` like any other field). README, "Placing clients"."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

__all__ = ["DispatchSettings"]


class DispatchSettings(BaseSettings):
    # push service (issue 24): a gateway that at least `min_failures` clients reported
    # (`GET /v1/dispatch?avoid=`) they could not connect to in the last window, and more
    # than `ratio` times its successful connects there, is skipped by dispatch while
    # another can take the client (min 0: never skipped). At most the ten minutes the
    # fleet's counts are kept.
    dispatch_skip_window_s: float = Field(30.0, gt=0, le=600)
    dispatch_skip_min_failures: int = Field(5, ge=0, le=1_000_000)
    dispatch_skip_ratio: float = Field(1.0, ge=0, le=1000)
