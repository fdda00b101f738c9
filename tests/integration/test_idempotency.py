"""Idempotency-Key on the push endpoints: real Redis, in-process apps, real gateways and
WebSocket clients (docs/guides/idempotency.md, "Idempotent pushes")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from push_service.idempotency.base import Answer, Claimed, fingerprint, scope_hash
from push_service.idempotency.store import RedisIdempotencyStore
from router.processes.ports import free_port
from shared.keys import KeySchema
from tests.conftest import API_KEY, BAD_IDEMPOTENCY_KEYS
from tests.integration.procs import push_services, service_env
from tests.integration.stack import (
    AUTH,
    alice_online,
    api,
    client,
    gateway,
    nothing_more,
    one_group,
    recv_json,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

PUSH = {"to": ["alice"], "content": {"text": "once"}}
PUSH_TWO = {"to": ["alice", "bob"], "content": {"text": "once"}}


def _with_key(key: str | bytes, auth: dict[str, str] = AUTH) -> dict[str, Any]:
    return {**auth, "Idempotency-Key": key}


async def test_twenty_concurrent_requests_with_one_key_push_once(
    redis_url: str, prefix: str
) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        async with client(gw, "alice") as phone, client(gw, "alice") as laptop:
            answers = await asyncio.gather(
                *(http.post("/v1/push", json=PUSH, headers=_with_key("k-20")) for _ in range(20))
            )
            assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
            bodies = [a.json() for a in answers]
            assert len({b["push_id"] for b in bodies}) == 1
            assert all(b == bodies[0] for b in bodies)
            assert bodies[0]["delivered"] == ["alice"]
            # One frame per device, then nothing: the push ran once.
            for ws in (phone, laptop):
                frame = await recv_json(ws)
                assert frame["push_id"] == bodies[0]["push_id"]
                assert await nothing_more(ws)
            assert gw.deliver_service.calls == 1
            # All but the first were answered from Redis.
            assert sum(a.headers.get("Idempotent-Replayed") == "true" for a in answers) == 19


async def test_the_same_key_with_another_body_or_path_is_refused(
    redis_url: str, prefix: str
) -> None:
    async with alice_online(redis_url, prefix) as (_, http, ws):
        first = await http.post("/v1/push", json=PUSH, headers=_with_key("k1"))
        assert first.status_code == 200, first.text
        await recv_json(ws)
        other = {**PUSH, "content": {"text": "twice"}}
        for path, body in (("/v1/push", other), ("/v1/multicast", PUSH)):
            refused = await http.post(path, json=body, headers=_with_key("k1"))
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"] == "invalid_request"
            assert refused.json()["detail"][0]["field"] == "Idempotency-Key"
        assert await nothing_more(ws)


async def test_a_replay_answers_again_and_keys_are_scoped_per_api_key(
    redis_url: str, prefix: str, redis: Any
) -> None:
    other_key = "another-api-key-9876543210"
    async with (
        one_group(redis_url, prefix) as (gw, http),
        api(redis_url, prefix, api_key=other_key) as other,
    ):
        async with client(gw, "alice") as ws:
            first = await http.post("/v1/push", json=PUSH, headers=_with_key("k1"))
            assert first.status_code == 200, first.text
            assert "Idempotent-Replayed" not in first.headers
            await recv_json(ws)
            again = await http.post("/v1/push", json=PUSH, headers=_with_key("k1"))
            assert again.status_code == 200
            assert again.content == first.content
            assert again.headers["Idempotent-Replayed"] == "true"
            assert await nothing_more(ws)
            # The other API key's "k1" is its own: pushed again, with a push_id of its own.
            theirs = await other.post(
                "/v1/push",
                json=PUSH,
                headers=_with_key("k1", {"Authorization": f"Bearer {other_key}"}),
            )
            assert theirs.status_code == 200, theirs.text
            assert theirs.json()["push_id"] != first.json()["push_id"]
            assert (await recv_json(ws))["push_id"] == theirs.json()["push_id"]
            # Stored under digests: neither API key nor the header's value is in Redis.
            names = [k async for k in redis.scan_iter(match=f"{prefix}idem:*")]
            assert len(names) == 2
            for name in names:
                assert "k1" not in name.removeprefix(prefix) and "api-key" not in name
                assert all(other_key not in str(v) for v in (await redis.hgetall(name)).values())
            assert 0 < await redis.ttl(names[0]) <= 86_400


async def test_a_5xx_is_not_kept_so_the_retry_runs(redis_url: str, prefix: str, redis: Any) -> None:
    async with alice_online(redis_url, prefix) as (_, http, ws):
        retried = await _fails_then_retried(http, redis, prefix, "r1")
        assert retried.json()["delivered"] == ["alice"]
        assert "Idempotent-Replayed" not in retried.headers
        kept = await http.post("/v1/push", json=PUSH_TWO, headers=_with_key("r1"))
        assert kept.content == retried.content
        assert kept.headers["Idempotent-Replayed"] == "true"
        pushed = await _drain(ws)
        # The retry was delivered once. (The failed attempt's message comes too: it was
        # written to alice's recovery log before bob's write failed, and the retry's
        # delivery replays the gap. That is the P2P path's doing, not the key's.)
        assert pushed.count(retried.json()["push_id"]) == 1, pushed


async def test_a_batch_answer_with_a_5xx_message_is_not_kept(
    redis_url: str, prefix: str, redis: Any
) -> None:
    """A batch is answered 200 with a status per message: one that holds a 503 is not
    kept either, so the retry with the key runs the batch again."""
    body = {"messages": [PUSH, {"to": ["bob"], "content": 2}]}
    async with alice_online(redis_url, prefix) as (_, http, _ws):
        seq = KeySchema(prefix).user_seq("bob")
        await redis.set(seq, "not a hash")
        failed = await http.post("/v1/push/batch", json=body, headers=_with_key("b-1"))
        assert failed.status_code == 200, failed.text
        assert 503 in [r["status"] for r in failed.json()["results"]], failed.text
        await redis.delete(seq)
        retried = await http.post("/v1/push/batch", json=body, headers=_with_key("b-1"))
        assert "Idempotent-Replayed" not in retried.headers
        assert [r["status"] for r in retried.json()["results"]] == [200, 200], retried.text
        kept = await http.post("/v1/push/batch", json=body, headers=_with_key("b-1"))
        assert kept.headers["Idempotent-Replayed"] == "true"
        assert kept.content == retried.content


async def test_a_retry_after_a_5xx_carries_the_first_attempts_msg_id(
    redis_url: str, prefix: str, redis: Any
) -> None:
    """The failed attempt's message was logged for alice before bob's write failed and
    comes to her too (above): under one Idempotency-Key both copies carry one msg_id, so her
    client drops the second; without a key they are two messages to the app."""
    async with alice_online(redis_url, prefix) as (_, http, ws):
        retried = await _fails_then_retried(http, redis, prefix, "same-msg")
        frames = []
        with contextlib.suppress(TimeoutError):
            while True:
                frames.append(await recv_json(ws, timeout=0.5))
        msg_ids = [f["msg_id"] for f in frames if f["type"] == "push"]
        assert msg_ids == [retried.json()["msg_id"]] * 2, frames


async def test_a_key_used_again_for_another_request_names_another_message(
    redis_url: str, prefix: str, redis: Any
) -> None:
    """After a 5xx releases a key, the same key with another body is another request: its
    message gets an id of its own, or alice's client would drop it as a copy of the
    failed attempt's (logged for her before bob's write failed)."""
    async with alice_online(redis_url, prefix) as (_, http, ws):
        seq = KeySchema(prefix).user_seq("bob")
        await redis.set(seq, "not a hash")
        failed = await http.post("/v1/push", json=PUSH_TWO, headers=_with_key("reused"))
        assert failed.status_code == 503, failed.text
        await redis.delete(seq)
        other = {**PUSH_TWO, "content": {"text": "another"}}
        sent = await http.post("/v1/push", json=other, headers=_with_key("reused"))
        assert sent.status_code == 200, sent.text
        frames = []
        with contextlib.suppress(TimeoutError):
            while True:
                frames.append(await recv_json(ws, timeout=0.5))
        pushed = [(f["msg_id"], f["content"]["text"]) for f in frames if f["type"] == "push"]
        assert len(pushed) == 2 and {text for _, text in pushed} == {"once", "another"}
        assert len({msg_id for msg_id, _ in pushed}) == 2, pushed


@pytest.mark.parametrize("path", ["/v1/broadcast", "/v1/multicast"])
async def test_a_fan_out_run_again_under_its_key_carries_the_same_msg_id(
    path: str, redis_url: str, prefix: str, redis: Any
) -> None:
    """A push service that dies after starting a job, before its answer is kept, leaves
    a marker whose lease lapses, and the caller's retry starts a second job: both
    copies carry one msg_id, so alice's client drops the second. (The kept answer is
    deleted here, as the lapsed marker would be gone.) Without a key: two messages."""
    body: dict[str, Any] = {"content": {"text": "all"}}
    body |= {"audience": {"online": True}} if path == "/v1/broadcast" else {"to": ["alice"]}
    async with alice_online(redis_url, prefix) as (_, http, ws):
        first = await http.post(path, json=body, headers=_with_key("fan-out"))
        assert first.status_code == 202, first.text
        [entry] = [k async for k in redis.scan_iter(match=f"{prefix}idem:*")]
        assert (await redis.hget(entry, "state")) in ("done", b"done")  # the 202 kept
        await redis.delete(entry)
        again = await http.post(path, json=body, headers=_with_key("fan-out"))
        assert again.status_code == 202, again.text
        unkeyed = [(await http.post(path, json=body, headers=AUTH)).json() for _ in range(2)]
        ids = {first.json()["push_id"], again.json()["push_id"], *(u["push_id"] for u in unkeyed)}
        assert len(ids) == 4  # each attempt is a job of its own
        frames = []
        with contextlib.suppress(TimeoutError):
            while True:
                frames.append(await recv_json(ws, timeout=1.0))
        msg_of = {f["push_id"]: f["msg_id"] for f in frames if f["type"] == "push"}
        assert msg_of.keys() == ids, frames
        assert msg_of[first.json()["push_id"]] == msg_of[again.json()["push_id"]]
        assert len({msg_of[u["push_id"]] for u in unkeyed}) == 2


async def _fails_then_retried(
    http: httpx.AsyncClient, redis: Any, prefix: str, key: str
) -> httpx.Response:
    """PUSH_TWO to alice and bob with `key` while a value of the wrong type stands where
    bob's sequence is (Redis refuses his log write, WRONGTYPE: a 503, nothing sent; alice's
    log entry, written first, stands), then again with the same key once it is gone: the
    retry's answer, a 200."""
    seq = KeySchema(prefix).user_seq("bob")
    await redis.set(seq, "not a hash")
    failed = await http.post("/v1/push", json=PUSH_TWO, headers=_with_key(key))
    assert failed.status_code == 503, failed.text
    await redis.delete(seq)
    retried = await http.post("/v1/push", json=PUSH_TWO, headers=_with_key(key))
    assert retried.status_code == 200, retried.text
    return retried


async def _drain(ws: Any) -> list[str]:
    """The push_ids of every frame that comes within 0.3 s of the last."""
    pushed = []
    while True:
        try:
            frame = await recv_json(ws, timeout=0.3)
        except TimeoutError:
            return pushed
        pushed.append(frame.get("push_id", frame["type"]))


@pytest.mark.parametrize(("value", "problem"), BAD_IDEMPOTENCY_KEYS)
async def test_a_bad_header_is_refused_by_name(
    redis_url: str, prefix: str, redis: Any, value: bytes, problem: str
) -> None:
    async with api(redis_url, prefix) as http:
        for path, body in (("/v1/push", PUSH), ("/v1/broadcast", {"content": 1})):
            resp = await http.post(path, json=body, headers=_with_key(value))
            assert resp.status_code == 422, resp.text
            (detail,) = resp.json()["detail"]
            assert detail["field"] == "Idempotency-Key" and problem in detail["message"]
        assert [k async for k in redis.scan_iter(match=f"{prefix}idem:*")] == []


async def test_255_printable_characters_are_a_key(redis_url: str, prefix: str) -> None:
    async with api(redis_url, prefix) as http:
        key = ("a b~!" * 51)[:255]
        first = await http.post("/v1/push", json=PUSH, headers=_with_key(key))
        again = await http.post("/v1/push", json=PUSH, headers=_with_key(key))
        assert first.status_code == again.status_code == 200, first.text
        assert again.json()["push_id"] == first.json()["push_id"]


async def test_one_key_pushes_once_across_two_push_services(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    env = service_env(redis_url, prefix, tmp_path)
    ports = [free_port(), free_port()]
    async with push_services(env, ports):
        async with gateway(redis_url, prefix, "gw1", "g1") as gw:
            async with client(gw, "alice") as phone, client(gw, "alice") as laptop:
                async with httpx.AsyncClient(timeout=10) as http:
                    answers = await asyncio.gather(
                        *(
                            http.post(
                                f"http://127.0.0.1:{ports[n % 2]}/v1/push",
                                json=PUSH,
                                headers=_with_key("k-two"),
                            )
                            for n in range(20)
                        )
                    )
                assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
                assert len({a.json()["push_id"] for a in answers}) == 1
                for ws in (phone, laptop):
                    assert await _drain(ws) == [answers[0].json()["push_id"]]


async def test_a_duplicate_waits_for_a_running_first_then_gets_409_past_the_bound(
    redis_url: str, prefix: str, redis: Any
) -> None:
    """A first request still running (here: one whose process holds the claim and never
    answers, within its lease): a duplicate waits the deliver timeout plus 5 s, and the
    push's own `wait_ack_ms`, then 409. Once the first answers, a duplicate gets that
    answer."""
    store = RedisIdempotencyStore(redis, KeySchema(prefix), ttl_s=60, lease_s=30)
    body = json.dumps({"to": ["nobody"], "content": 1, "wait_ack_ms": 1000}).encode()
    scope = scope_hash(API_KEY)
    held = await store.claim(scope, "slow-1", fingerprint("POST", "/v1/push", body))
    assert isinstance(held, Claimed)
    headers = {**_with_key("slow-1"), "Content-Type": "application/json"}
    async with api(redis_url, prefix, deliver_timeout_s=0.2) as http:
        started = time.monotonic()
        resp = await http.post("/v1/push", content=body, headers=headers)
        waited = time.monotonic() - started
        assert resp.status_code == 409 and resp.json()["error"] == "conflict", resp.text
        assert "still running" in resp.json()["detail"]
        assert 6.2 <= waited < 9.0, waited  # 0.2 s + the 5 s margin + 1 s, then no more

        # The first request answers while a duplicate waits: the duplicate gets it.
        async def answer_soon() -> None:
            await asyncio.sleep(0.5)
            assert await store.complete(scope, "slow-1", held.token, Answer(200, b'{"first":1}'))

        answering = asyncio.create_task(answer_soon())
        resp = await http.post("/v1/push", content=body, headers=headers)
        await answering
        assert resp.status_code == 200 and resp.json() == {"first": 1}
        assert resp.headers["idempotent-replayed"] == "true"
