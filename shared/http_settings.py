"""The push service's HTTP server settings, a mixin of `shared.settings.Settings`.

Kept apart so the one settings class stays readable; `Settings` inherits every field
here, and `Settings.load` reads them as `IMROUTE_*` like any other.
"""

from __future__ import annotations

import os
import re
from typing import Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings

__all__ = ["WS_SOURCE", "HttpSettings", "default_workers"]

# A CSP source a WebSocket may go to: a scheme, or a scheme and host (and port).
WS_SOURCE = re.compile(r"wss?:(//(\*\.)?[A-Za-z0-9.-]+(:([0-9]{1,5}|\*))?)?")


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


class HttpSettings(BaseSettings):
    """How the push service serves HTTP (uvicorn's limits, workers),
    and how large a request head every HTTP listener takes (shared.http_heads)."""

    # a request head (request line and headers) must arrive within this many seconds of
    # the connection opening, or of the next request's first byte: slowloris heads are cut
    http_header_timeout_s: float = Field(10.0, gt=0, le=300)
    # every HTTP listener (push service, gateway WebSocket and metrics ports): a request
    # head (request line, headers, blank line) over this many bytes is refused 431 ...
    http_max_head_bytes: int = Field(16 * 1024, ge=1024, le=1 << 20)
    # ... and one with more header fields than this; at most 128, as the gateway's
    # WebSocket library refuses more
    http_max_headers: int = Field(100, ge=8, le=128)
    # ... and a request target (path and query) over this many bytes is refused 414;
    # at most 8000, as the gateway's WebSocket library refuses a request line over 8 KiB.
    # /v1/dispatch refuses a token that would not fit in the gateway's URL
    http_max_url_bytes: int = Field(8000, ge=256, le=8000)
    # an idle keep-alive connection is closed after this many seconds (uvicorn's own)
    http_keepalive_timeout_s: int = Field(5, ge=1, le=3600)
    # open connections or running requests past which uvicorn answers 503 (per worker)
    http_max_concurrency: int = Field(10_000, ge=1, le=1_000_000)
    # load shedding (push_service.shedding), per worker: requests handled at once past
    # which the next is answered 503 overloaded (the operator's not counted) ...
    http_max_in_flight: int = Field(500, ge=1, le=1_000_000)
    # ... and the event loop's lag in ms past which new requests are 503 while at least
    # a few are in flight (0: lag never sheds)
    http_max_lag_ms: int = Field(1000, ge=0, le=60_000)
    # the dashboard's Content-Security-Policy `connect-src`, besides 'self': where its test
    # client may open WebSockets (the gateways dispatch names). The default takes any
    # gateway; set the gateways' origins, e.g. "wss://gw1.example.com wss://*.example.com"
    dashboard_connect_src: str = Field("ws: wss:", min_length=3, max_length=1000)
    # push-service processes sharing the one listening port (README, "Workers"); the
    # default is the cores this process may use
    workers: int = Field(default_factory=default_workers, ge=1, le=256)

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

    @model_validator(mode="after")
    def _url_fits_in_a_head(self) -> Self:
        if self.http_max_url_bytes >= self.http_max_head_bytes:
            raise ValueError(
                f"IMROUTE_HTTP_MAX_URL_BYTES ({self.http_max_url_bytes}) must be less than "
                f"IMROUTE_HTTP_MAX_HEAD_BYTES ({self.http_max_head_bytes}): the request "
                "line is part of the head"
            )
        return self
