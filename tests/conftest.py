"""Shared fixtures: a real Redis (the one at IMROUTE_REDIS_URL, else an embedded one)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

# Before anything imports grpc: this process runs gRPC servers and clients and also
# starts subprocesses, and gRPC's fork support restarts its poller in the child between
# fork and exec, where Popen(close_fds=True) has closed the poller's epoll fd: the child
# then hangs before it execs (seen as a push service that never started, grpc/grpc#43055).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import httpx
import pytest
import redis.asyncio as aioredis

from router.processes.embedded_redis import EmbeddedRedis, redis_answers
from shared.clock import ManualClock
from tests.pubsub_emulator import PROJECT, find_emulator, running_emulator

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
API_KEY = "test-api-key-0123456789"
ADMIN_KEY = "test-admin-key-0123456789"
SECRET = "test-secret-0123456789abcdef-0123456789"

# Bodies of POST /v1/push that fail validation, each with the field its 422 names
# (the API tier and the integration tier check the same cases).
MALFORMED_PUSHES = [
    ({"content": 1}, "body.to"),
    ({"to": [], "content": 1}, "body.to"),
    ({"to": [""], "content": 1}, "body.to.0"),
    ({"to": ["x" * 129], "content": 1}, "body.to.0"),
    ({"to": ["alice", "alice"], "content": 1}, "body.to"),
    ({"to": "alice", "content": 1}, "body.to"),
    ({"to": ["alice"]}, "body.content"),
    ({"to": ["alice"], "content": 1, "msg_type": "x"}, "body.msg_type"),
    ({"to": ["alice"], "content": 1, "msg_type": -1}, "body.msg_type"),
    ({"to": ["alice"], "content": 1, "from": ""}, "body.from"),
    ({"to": ["alice"], "content": 1, "extra": True}, "body.extra"),
    ({"to": [f"u{i}" for i in range(1001)], "content": 1}, "body.to"),
]

# Raw JSON bodies, by path, whose content holds a lone surrogate (half an emoji).
LONE_SURROGATES = [
    ("/v1/push", b'{"to":["alice"],"content":"\\ud83d"}'),
    ("/v1/push", b'{"to":["alice"],"content":{"k\\udc00":1}}'),
    ("/v1/multicast", b'{"to":["alice"],"content":["ok","\\ud83d"]}'),
    ("/v1/broadcast", b'{"content":"\\ud83d"}'),
]

# Idempotency-Key header values that are refused, each with a word its 422 says.
BAD_IDEMPOTENCY_KEYS = [
    (b"", "empty"),
    (b"k" * 256, "at most 255"),
    (b"tab\there", "printable"),
    ("caf\u00e9".encode("latin-1"), "printable"),
]


def invalid_details(resp: httpx.Response) -> list[dict[str, Any]]:
    """The details of a 422 `invalid_request` answer, once asserted that it is one."""
    assert resp.status_code == 422, resp.text
    payload = resp.json()
    assert payload["error"] == "invalid_request"
    details: list[dict[str, Any]] = payload["detail"]
    return details


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis for the whole run; embedded when none answers at IMROUTE_REDIS_URL."""
    url = os.environ.get("IMROUTE_REDIS_URL", DEFAULT_REDIS_URL)
    if redis_answers(url):
        yield url
        return
    with EmbeddedRedis() as embedded:
        print(f"\nno Redis at {url}; using an embedded one at {embedded.url}")
        yield embedded.url


@pytest.fixture(scope="session")
def pubsub_project() -> Iterator[str]:
    """A project on the official Pub/Sub emulator, started once for the run; the tests
    that take it skip, with the reason in the summary, where it is not installed."""
    launcher = find_emulator()
    if launcher is None:
        pytest.skip(
            "the Pub/Sub emulator is not installed (gcloud's cloud-pubsub-emulator; "
            "or set IMROUTE_PUBSUB_EMULATOR to its launcher)"
        )
    saved = os.environ.get("PUBSUB_EMULATOR_HOST")
    with running_emulator(launcher) as host:
        os.environ["PUBSUB_EMULATOR_HOST"] = host
        try:
            yield PROJECT
        finally:
            if saved is None:
                os.environ.pop("PUBSUB_EMULATOR_HOST", None)
            else:
                os.environ["PUBSUB_EMULATOR_HOST"] = saved


@pytest.fixture
def clock() -> ManualClock:
    """The injected clock, moved by hand; wall time starts at `ManualClock.wall_ms`."""
    return ManualClock()


@pytest.fixture
def prefix() -> str:
    """A key prefix of its own per test, so tests never see each other's keys."""
    return f"imroute-test:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
async def redis(redis_url: str, prefix: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()
