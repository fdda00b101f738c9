"""Bad input at the HTTP edge: clear 4xx JSON errors, and nothing reaches a gateway or a
socket; and /healthz while Redis is down. (The HTTP contract alone, on the in-memory
stores: tests/api/test_http_contract.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import LONE_SURROGATES, MALFORMED_PUSHES, invalid_details
from tests.integration.stack import AUTH, alice_online, api, nothing_more, one_group

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("redis")
@pytest.mark.parametrize(
    ("body", "field"),
    MALFORMED_PUSHES,
)
async def test_malformed_push_is_422_naming_the_field(
    redis_url: str, prefix: str, body: dict[str, Any], field: str
) -> None:
    async with alice_online(redis_url, prefix) as (gw, http, ws):
        resp = await http.post("/v1/push", json=body, headers=AUTH)
        assert field in [d["field"] for d in invalid_details(resp)], resp.text
        assert gw.deliver_service.calls == 0
        assert await nothing_more(ws, 0.1)


@pytest.mark.usefixtures("redis")
async def test_oversized_content_is_413_and_not_sent(redis_url: str, prefix: str) -> None:
    async with alice_online(redis_url, prefix) as (gw, http, ws):
        resp = await http.post(
            "/v1/push", json={"to": ["alice"], "content": "x" * (64 * 1024)}, headers=AUTH
        )
        assert resp.status_code == 413
        assert resp.json()["detail"][0]["field"] == "content"
        # Just under the limit once encoded (two quotes) is fine.
        ok = await http.post(
            "/v1/push", json={"to": ["alice"], "content": "x" * (64 * 1024 - 2)}, headers=AUTH
        )
        assert ok.status_code == 200
        assert gw.deliver_service.calls == 1
        frame = await ws.recv()
        assert len(frame) > 64 * 1024
        assert await nothing_more(ws, 0.1)


@pytest.mark.usefixtures("redis")
async def test_healthz_needs_no_key_and_tracks_redis(redis_url: str, prefix: str) -> None:
    async with api(redis_url, prefix) as http:
        resp = await http.get("/healthz")
        assert resp.status_code == 200 and resp.json() == {"status": "ok"}
        assert (await http.get("/docs")).status_code == 200
        assert (await http.get("/openapi.json")).json()["paths"]["/v1/push"]
    async with api("redis://127.0.0.1:1/0", prefix) as http:
        resp = await http.get("/healthz")
        assert resp.status_code == 503
        push = await http.post("/v1/push", json={"to": ["a"], "content": 1}, headers=AUTH)
        assert push.status_code == 503
        assert "nothing was sent" in push.json()["detail"]


@pytest.mark.parametrize(
    ("path", "raw"),
    LONE_SURROGATES,
)
async def test_a_lone_surrogate_in_content_is_422_naming_content(
    redis_url: str, prefix: str, path: str, raw: bytes
) -> None:
    """Half an emoji ("\\ud83d", as a JS client cuts a string) is valid JSON, but not
    Unicode: a clear 422, not a 500, and nothing is sent."""
    async with one_group(redis_url, prefix) as (gw, http):
        resp = await http.post(
            path, content=raw, headers={**AUTH, "Content-Type": "application/json"}
        )
        detail = invalid_details(resp)[0]
        assert detail["field"] == "content" and "surrogate" in detail["message"]
        assert gw.deliver_service.calls == 0 and gw.deliver_service.batches == 0
        # A whole emoji, escaped as its surrogate pair, is fine.
        ok = await http.post(
            "/v1/push",
            content=b'{"to":["alice"],"content":"\\ud83d\\ude00"}',
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert ok.status_code == 200, ok.text
