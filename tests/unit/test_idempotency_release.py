"""A 5xx's Idempotency-Key is released even when Redis failed the release itself (a
failover): tried again in the background, so retries are not held off for the lease."""

from __future__ import annotations

import asyncio

import pytest

from push_service import idempotency
from push_service.idempotency import Idempotency
from router.idempotency.base import Answer, Outcome
from shared.errors import RegistryUnavailable


class FlakyReleases:
    """An IdempotencyStore whose first `failures` releases fail as Redis would."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.released: list[str] = []

    async def claim(self, scope: str, key: str, fingerprint: str) -> Outcome:
        raise NotImplementedError

    async def complete(self, scope: str, key: str, token: str, answer: Answer) -> bool:
        raise NotImplementedError

    async def release(self, scope: str, key: str, token: str) -> None:
        if self.failures:
            self.failures -= 1
            raise RegistryUnavailable("redis: connection refused")
        self.released.append(key)


async def test_a_release_redis_refused_is_made_once_it_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(idempotency, "RELEASE_RETRY_S", 0.001)
    store = FlakyReleases(failures=3)
    once = Idempotency(store, wait_s=1.0)
    await once._release("scope", "k1", "token")  # does not raise: the answer goes out
    for _ in range(200):
        if store.released:
            break
        await asyncio.sleep(0.005)
    assert store.released == ["k1"] and store.failures == 0
