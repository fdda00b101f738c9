"""POST /v1/push/batch: up to 1000 messages, one answer each, in order; a bad
message fails only itself. Real gateways, Redis and WebSocket clients."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.integration.stack import AUTH, alice_online, api, client, nothing_more, two_groups

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def test_each_message_is_pushed_and_answered_in_order(redis_url: str, prefix: str) -> None:
    async with (
        two_groups(redis_url, prefix) as (gw1, gw2, http),
        client(gw1, "alice") as alice,
        client(gw2, "bob") as bob,
    ):
        messages: list[dict[str, Any]] = [
            {"to": ["alice"], "content": {"n": 0}},
            {"to": ["bob", "carol"], "content": {"n": 1}, "from": "bot", "msg_type": 3},
            {"to": ["alice", "bob"], "content": {"n": 2}, "store": False},
        ]
        resp = await http.post("/v1/push/batch", json={"messages": messages}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert [r["index"] for r in results] == [0, 1, 2]
        assert [r["status"] for r in results] == [200, 200, 200]
        assert results[0]["delivered"] == ["alice"]
        assert results[1]["delivered"] == ["bob"] and results[1]["queued"] == ["carol"]
        assert sorted(results[2]["delivered"]) == ["alice", "bob"]
        assert len({r["push_id"] for r in results}) == 3
        got_alice = [json.loads(await alice.recv()) for _ in range(2)]
        got_bob = [json.loads(await bob.recv()) for _ in range(2)]
        assert sorted(f["content"]["n"] for f in got_alice) == [0, 2]
        assert sorted(f["content"]["n"] for f in got_bob) == [1, 2]
        by_n = {f["content"]["n"]: f for f in got_bob}
        assert (by_n[1]["from"], by_n[1]["msg_type"]) == ("bot", 3)
        assert by_n[1]["msg_id"] == results[1]["msg_id"]
        # Each message has its own receipt, as a single push has.
        status = (await http.get(f"/v1/pushes/{results[1]['push_id']}", headers=AUTH)).json()
        assert (status["recipients"], status["queued"]) == (2, 1)


async def test_lone_surrogates_are_422_naming_the_field_not_500(
    redis_url: str, prefix: str
) -> None:
    """JSON may escape half a character ("\\ud83d"), which json.loads keeps and UTF-8
    cannot hold: each such message gets its 422, as POST /v1/push gives it (found by
    the schema fuzzer)."""
    async with api(redis_url, prefix) as http:
        body = (
            b'{"messages":[{"to":["a"],"content":null,"from":"0\\ud83d"},'
            b'{"to":["a"],"content":"x\\ud83d"},{"to":["a"],"content":"\\ud83d\\ude00"}]}'
        )
        resp = await http.post(
            "/v1/push/batch", content=body, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert [r["status"] for r in results] == [422, 422, 200], results
        assert results[0]["detail"][0]["field"] == "body.messages.0.from"
        assert results[1]["detail"][0]["field"] == "body.messages.1.content"


async def test_a_bad_message_fails_only_itself_naming_index_and_field(
    redis_url: str, prefix: str
) -> None:
    async with alice_online(redis_url, prefix) as (_, http, ws):
        messages: list[Any] = [
            {"to": ["alice"], "content": "ok-0"},
            {"to": ["alice", "alice"], "content": 1},  # duplicate uids
            {"to": [""], "content": 1},  # an empty uid
            {"to": ["alice"], "content": 1, "wait_ack_ms": 100},  # not in a batch
            "not an object",
            {"to": ["alice"], "content": "x" * (64 * 1024)},  # content over the limit
            {"to": ["alice"], "content": "ok-6", "sender": "bot"},  # valid for pydantic
        ]
        resp = await http.post("/v1/push/batch", json={"messages": messages}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert [r["status"] for r in results] == [200, 422, 422, 422, 422, 413, 200]
        fields = {r["index"]: [d["field"] for d in r["detail"]] for r in results if r.get("detail")}
        assert fields[1] == ["body.messages.1.to"]
        assert fields[2] == ["body.messages.2.to.0"]
        assert fields[3] == ["body.messages.3.wait_ack_ms"]
        assert fields[4] == ["body.messages.4"]
        assert results[5]["error"] == "payload_too_large"
        assert results[5]["detail"][0]["field"] == "body.messages.5.content"
        assert all(r["error"] == "invalid_request" for r in results[1:5])
        got = sorted([json.loads(await ws.recv())["content"] for _ in range(2)])
        assert got == ["ok-0", "ok-6"]
        assert await nothing_more(ws, 0.2)  # nothing else was sent


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body.messages"),
        ({"messages": []}, "body.messages"),
        ({"messages": [{"to": ["a"], "content": 1}] * 1001}, "body.messages"),
        ({"messages": {"to": ["a"]}}, "body.messages"),
        ({"messages": [{"to": ["a"], "content": 1}], "extra": 1}, "body.extra"),
    ],
)
async def test_a_bad_envelope_is_one_422(
    redis_url: str, prefix: str, body: Any, field: str
) -> None:
    async with api(redis_url, prefix) as http:
        resp = await http.post("/v1/push/batch", json=body, headers=AUTH)
        assert resp.status_code == 422, resp.text
        assert field in [d["field"] for d in resp.json()["detail"]]


async def test_a_batch_needs_the_push_key_and_is_idempotent(redis_url: str, prefix: str) -> None:
    async with alice_online(redis_url, prefix) as (_, http, ws):
        body = {"messages": [{"to": ["alice"], "content": "once"}]}
        assert (await http.post("/v1/push/batch", json=body)).status_code == 401
        headers = {**AUTH, "Idempotency-Key": "batch-1"}
        first, again = await asyncio.gather(
            http.post("/v1/push/batch", json=body, headers=headers),
            http.post("/v1/push/batch", json=body, headers=headers),
        )
        assert first.status_code == again.status_code == 200
        assert first.json() == again.json()
        assert json.loads(await ws.recv())["content"] == "once"
        assert await nothing_more(ws, 0.2)  # one delivery for the two requests
        other = await http.post(
            "/v1/push/batch", json={"messages": [{"to": ["alice"], "content": 2}]}, headers=headers
        )
        assert other.status_code == 422
