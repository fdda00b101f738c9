"""IMROUTE_JWT_* on a real gateway and on dispatch: both take the same tokens, and
refuse the same ones (401 at the handshake, 401 from GET /v1/dispatch)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from shared.clock import SystemClock
from tests.conftest import SECRET
from tests.integration.stack import api, gateway, one_group, ready

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


def signed(**claims: Any) -> str:
    now = SystemClock().now_ms() // 1000
    base: dict[str, Any] = {"sub": "alice", "iat": now, "exp": now + 600}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, SECRET, "HS256")


async def answers(gw_port: int, http: httpx.AsyncClient, tok: str) -> tuple[int, int]:
    """(the gateway's handshake status, dispatch's status) for `tok`."""
    try:
        async with connect(f"ws://127.0.0.1:{gw_port}/ws?token={tok}") as ws:
            await ready(ws)
            handshake = 101
    except InvalidStatus as exc:
        handshake = exc.response.status_code
    resp = await http.get("/v1/dispatch", headers={"Authorization": f"Bearer {tok}"})
    return handshake, resp.status_code


async def test_audience_issuer_leeway_and_lifetime_on_the_gateway_and_dispatch(
    redis_url: str, prefix: str
) -> None:
    now = SystemClock().now_ms() // 1000
    options = {
        "jwt_audience": "chat-app",
        "jwt_issuer": "auth.example",
        "jwt_leeway_s": 5,
        "jwt_max_ttl_s": 3600,
    }
    ok = {"aud": "chat-app", "iss": "auth.example"}
    async with AsyncExitStack() as stack:
        gw = await stack.enter_async_context(gateway(redis_url, prefix, "gw1", "g1", **options))
        http = await stack.enter_async_context(api(redis_url, prefix, **options))
        cases = {
            "good": (signed(**ok), (101, 200)),
            "within the leeway": (signed(**ok, exp=now - 3), (101, 200)),
            "past the leeway": (signed(**ok, exp=now - 10), (401, 401)),
            "no audience": (signed(iss="auth.example"), (401, 401)),
            "another audience": (signed(aud="other", iss="auth.example"), (401, 401)),
            "another issuer": (signed(aud="chat-app", iss="evil"), (401, 401)),
            "over the lifetime": (signed(**ok, exp=now + 3700), (401, 401)),
            "over it without iat": (signed(**ok, iat=None, exp=now + 3700), (401, 401)),
        }
        got = {name: await answers(gw.ws_port, http, tok) for name, (tok, _) in cases.items()}
        assert got == {name: want for name, (_, want) in cases.items()}


async def test_the_defaults_take_tokens_without_aud_or_iss_and_refuse_year_long_ones(
    redis_url: str, prefix: str
) -> None:
    now = SystemClock().now_ms() // 1000
    async with one_group(redis_url, prefix) as (gw, http):
        assert await answers(gw.ws_port, http, signed(iss="whoever")) == (101, 200)
        # A day (IMROUTE_JWT_MAX_TTL_S) at most.
        assert await answers(gw.ws_port, http, signed(exp=now + 86_400)) == (101, 200)
        assert await answers(gw.ws_port, http, signed(exp=now + 365 * 86_400)) == (401, 401)
