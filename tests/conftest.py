"""Shared fixtures: a real Redis (the one at IMROUTE_REDIS_URL, else an embedded one)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from router.embedded_redis import EmbeddedRedis, redis_answers

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
API_KEY = "test-api-key-0123456789"
SECRET = "test-secret-0123456789abcdef-0123456789"


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
