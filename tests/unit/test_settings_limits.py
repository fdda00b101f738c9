"""Each limits class reads its own IMROUTE_ settings: set ones, then the defaults."""

from __future__ import annotations

from typing import Any

import pytest

from shared.auth import TokenRules
from shared.http_heads import HeadLimits
from shared.settings import Settings
from socket_gateway.resume_budget import ResumeLimits
from socket_gateway.ws.admission import HandshakeLimits

# (class, environment, what it reads from it, what it reads from no environment)
ROWS: list[tuple[Any, dict[str, str], object, object]] = [
    (
        HeadLimits,
        {
            "IMROUTE_HTTP_MAX_HEAD_BYTES": "32768",
            "IMROUTE_HTTP_MAX_HEADERS": "50",
            "IMROUTE_HTTP_MAX_URL_BYTES": "4000",
        },
        HeadLimits(32768, 50, 4000),
        HeadLimits(16384, 100, 8000),
    ),
    (
        HandshakeLimits,
        {
            "IMROUTE_WS_MAX_PRE_AUTH": "50",
            "IMROUTE_WS_CONNECT_RATE_PER_IP": "2.5",
            "IMROUTE_WS_CONNECT_BURST_PER_IP": "4",
        },
        HandshakeLimits(50, 2.5, 4),
        HandshakeLimits(),
    ),
    (
        TokenRules,
        {
            "IMROUTE_JWT_AUDIENCE": "app",
            "IMROUTE_JWT_ISSUER": "auth.example",
            "IMROUTE_JWT_LEEWAY_S": "5",
            "IMROUTE_JWT_MAX_TTL_S": "0",
        },
        TokenRules("app", "auth.example", 5.0, None),
        TokenRules(),
    ),
    (
        ResumeLimits,
        {
            "IMROUTE_RECOVERY_RESUME_MAX": "50",
            "IMROUTE_RECOVERY_RESUME_MAX_BYTES": "65536",
            "IMROUTE_RECOVERY_RESUME_RATE_PER_UID": "0",
            "IMROUTE_RECOVERY_RESUME_BURST_PER_UID": "3",
        },
        ResumeLimits(50, 65536, 0.0, 3),
        ResumeLimits(1000, 1 << 20, 0.5, 20),
    ),
]


@pytest.mark.parametrize(("cls", "env", "read", "default"), ROWS, ids=[r[0].__name__ for r in ROWS])
def test_limits_come_from_their_settings(
    cls: Any, env: dict[str, str], read: object, default: object
) -> None:
    assert cls.from_settings(Settings.load(env)) == read
    assert cls.from_settings(Settings.load({})) == default
