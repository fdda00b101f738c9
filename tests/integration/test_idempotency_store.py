"""RedisIdempotencyStore on a real Redis: the claim, its lease and its fencing token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from push_service.idempotency.base import Answer, Claimed, Mismatch, Running
from push_service.idempotency.store import RedisIdempotencyStore
from router.redis.client import connect_redis
from shared.keys import KeySchema

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


@asynccontextmanager
async def claimed(
    redis_url: str, prefix: str, lease_s: float
) -> AsyncIterator[tuple[RedisIdempotencyStore, Claimed]]:
    """A store keeping answers 60 s and leasing claims `lease_s`, and the first claim of
    key "k" in scope "s" (fingerprint "fp")."""
    async with connect_redis(redis_url) as client:
        store = RedisIdempotencyStore(client, KeySchema(prefix), ttl_s=60, lease_s=lease_s)
        first = await store.claim("s", "k", "fp")
        assert isinstance(first, Claimed)
        yield store, first


async def test_a_claim_is_leased_then_kept_for_the_ttl(
    redis_url: str, prefix: str, redis: Any
) -> None:
    async with claimed(redis_url, prefix, lease_s=0.3) as (store, first):
        assert await store.claim("s", "k", "fp") == Running()
        assert await store.claim("s", "k", "other") == Mismatch()
        assert isinstance(await store.claim("other-scope", "k", "fp"), Claimed)
        # The holder died: its lease lapses and the next request claims the key.
        await asyncio.sleep(0.5)
        second = await store.claim("s", "k", "fp")
        assert isinstance(second, Claimed)
        # The first holder's token is fenced out; the second's answer is kept.
        assert not await store.complete("s", "k", first.token, Answer(200, b'{"n":1}'))
        await store.release("s", "k", first.token)
        assert await store.claim("s", "k", "fp") == Running()
        assert await store.complete("s", "k", second.token, Answer(202, b'{"n":2}'))
        assert await store.claim("s", "k", "fp") == Answer(202, b'{"n":2}')
        await asyncio.sleep(0.5)  # past the lease: kept for the TTL, not the lease
        assert await store.claim("s", "k", "fp") == Answer(202, b'{"n":2}')
        entry = KeySchema(prefix).idempotency("s", "")[: -len(":")]
        ttls = [await redis.pttl(k) async for k in redis.scan_iter(match=f"{prefix}idem:*")]
        assert any(50_000 < t <= 60_000 for t in ttls), ttls
        assert entry.startswith(f"{prefix}idem:")


async def test_a_released_claim_lets_the_next_request_run(redis_url: str, prefix: str) -> None:
    async with claimed(redis_url, prefix, lease_s=30) as (store, first):
        await store.release("s", "k", first.token)
        assert isinstance(await store.claim("s", "k", "fp"), Claimed)
