"""POST /v1/push's hot path (push_service.fast_push): taken for canonical bodies, and
every other request reaches the FastAPI route with its body whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection

from push_service.fast_push import FastPush
from tests.integration.stack import AUTH, api_app, client, gateway, nothing_more

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


def _fast_push(app: Any) -> FastPush:
    """The FastPush instance in the app's built middleware stack."""
    layer = app.middleware_stack
    while layer is not None and not isinstance(layer, FastPush):
        layer = getattr(layer, "app", None)
    assert isinstance(layer, FastPush)
    return layer


@asynccontextmanager
async def push_api(redis_url: str, prefix: str) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    async with api_app(redis_url, prefix) as (http, app):
        await http.get("/healthz")  # builds the middleware stack
        yield http, app


@asynccontextmanager
async def alice_and_app(
    redis_url: str, prefix: str
) -> AsyncIterator[tuple[httpx.AsyncClient, Any, ClientConnection]]:
    """`push_api`, and a client of a gateway connected as alice."""
    async with (
        gateway(redis_url, prefix, "gw1", "g1") as gw,
        push_api(redis_url, prefix) as (http, app),
        client(gw, "alice") as ws,
    ):
        yield http, app, ws


async def test_a_canonical_push_takes_the_hot_path_and_arrives(redis_url: str, prefix: str) -> None:
    async with alice_and_app(redis_url, prefix) as (http, app, ws):
        fast = _fast_push(app)
        resp = await http.post(
            "/v1/push", json={"to": ["alice", "bob"], "content": {"t": "é"}}, headers=AUTH
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "application/json"
        answer = resp.json()
        assert set(answer) == {
            "push_id", "msg_id", "delivered", "offline", "failed", "queued", "errors"
        }  # fmt: skip
        assert answer["delivered"] == ["alice"]
        assert answer["offline"] == answer["queued"] == ["bob"]
        assert fast.taken == 1
        frame = json.loads(await ws.recv())
        assert frame["content"] == {"t": "é"}
        assert frame["msg_id"] == answer["msg_id"]
        # The receipt of a hot-path push is recorded as the route's is.
        status = (await http.get(f"/v1/pushes/{answer['push_id']}", headers=AUTH)).json()
        assert status["recipients"] == 2


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        # Valid for pydantic only: the field's own name, a lax integer.
        ({"to": ["alice"], "content": 1, "sender": "bot"}, {}, 200),
        ({"to": ["alice"], "content": 1, "msg_type": "5"}, {}, 200),
        # An Idempotency-Key: the route keeps the answer.
        ({"to": ["alice"], "content": 1}, {"Idempotency-Key": "k-1"}, 200),
        # Invalid: the route's 422 names the field.
        ({"to": ["alice", "alice"], "content": 1}, {}, 422),
        ({"to": ["alice"], "content": 1, "ttl_s": 0}, {}, 422),
    ],
)
async def test_other_bodies_reach_the_route_whole(
    redis_url: str, prefix: str, body: Any, headers: Any, status: int
) -> None:
    async with alice_and_app(redis_url, prefix) as (http, app, ws):
        resp = await http.post("/v1/push", json=body, headers={**AUTH, **headers})
        assert resp.status_code == status, resp.text
        assert _fast_push(app).taken == 0
        if status == 200:
            assert resp.json()["delivered"] == ["alice"]
            assert json.loads(await ws.recv())["content"] == 1
        else:
            assert resp.json()["error"] == "invalid_request"
            assert await nothing_more(ws, 0.1)


async def test_bodies_json_loads_must_judge_reach_the_route(redis_url: str, prefix: str) -> None:
    """orjson refuses NaN and integers past 64 bits, which json.loads reads: the route
    gives its own answers (a 422 naming content; a push)."""
    async with alice_and_app(redis_url, prefix) as (http, app, ws):
        json_headers = {**AUTH, "Content-Type": "application/json"}
        nan = await http.post(
            "/v1/push", content=b'{"to":["alice"],"content":NaN}', headers=json_headers
        )
        assert nan.status_code == 422
        assert nan.json()["detail"][0]["field"] == "content"
        big = await http.post(
            "/v1/push", content=b'{"to":["alice"],"content":123456789012345678901234567890}',
            headers=json_headers,
        )  # fmt: skip
        assert big.status_code == 200, big.text
        # (pydantic's JsonValue makes it a float: the route's behaviour, unchanged)
        assert json.loads(await ws.recv())["content"] == pytest.approx(1.2345678901e29)
        # No content-type: the route's own answer (FastAPI reads no JSON from it).
        bare = await http.post("/v1/push", content=b'{"to":["alice"],"content":2}', headers=AUTH)
        assert bare.status_code == 422, bare.text
        assert bare.json()["detail"][0]["field"] == "body"
        assert _fast_push(app).taken == 0


async def test_refusals_on_the_hot_path_look_as_on_the_route(redis_url: str, prefix: str) -> None:
    """A key of no scope, a body over the limit, wait_ack_ms past the receipts bound: the
    same status and JSON as before the hot path."""
    async with push_api(redis_url, prefix) as (http, app):
        bad_key = await http.post(
            "/v1/push", json={"to": ["a"], "content": 1}, headers={"Authorization": "Bearer x"}
        )
        assert bad_key.status_code == 401
        assert bad_key.json()["error"] == "unauthorized"
        huge = await http.post(
            "/v1/push", json={"to": ["a"], "content": "x" * (2 << 20)}, headers=AUTH
        )
        assert huge.status_code == 413
        assert huge.json()["error"] == "payload_too_large"
        too_many = await http.post(
            "/v1/push",
            json={"to": [f"u{i}" for i in range(1000)], "content": 1, "wait_ack_ms": 10},
            headers=AUTH,
        )
        # IMROUTE_RECEIPTS_MAX_RECIPIENTS (10,000) allows 1000: this one is pushed.
        assert too_many.status_code == 200, too_many.text
        assert len(too_many.json()["unacked"]) == 1000
        assert _fast_push(app).taken == 1
