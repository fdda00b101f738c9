"""When Redis fails the Idempotency-Key's own write (a failover), the push's caller
still gets its answer, and the write is made again in the background once Redis takes
it: a 5xx's release (so retries are not held off for the lease), a done push's answer
(so a retry gets it replayed rather than 409)."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import Request
from fastapi.responses import Response

from push_service.idempotency.base import Answer, Outcome
from push_service.idempotency.http import Idempotency
from shared.errors import RegistryUnavailable
from tests.waiting import wait_for


class FlakyWrites:
    """An IdempotencyStore whose first `failures` writes fail as Redis would."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.released: list[str] = []
        self.kept: list[Answer] = []

    def _write(self) -> None:
        if self.failures:
            self.failures -= 1
            raise RegistryUnavailable("redis: connection refused")

    async def claim(self, scope: str, key: str, fingerprint: str) -> Outcome:
        raise NotImplementedError

    async def complete(self, scope: str, key: str, token: str, answer: Answer) -> bool:
        self._write()
        self.kept.append(answer)
        return True

    async def release(self, scope: str, key: str, token: str) -> None:
        self._write()
        self.released.append(key)


async def no_wait(_: float) -> None:
    await asyncio.sleep(0)


async def test_a_release_redis_refused_is_made_once_it_answers() -> None:
    store = FlakyWrites(failures=3)
    once = Idempotency(store, wait_s=1.0, sleep=no_wait)
    await once._release("scope", "k1", "token")  # does not raise: the answer goes out
    await wait_for(lambda: store.released, "the release", 2.0, every=0.005)
    assert store.released == ["k1"] and store.failures == 0


async def test_a_done_push_whose_answer_redis_refused_answers_and_keeps_it_later() -> None:
    store = FlakyWrites(failures=2)
    once = Idempotency(store, wait_s=1.0, sleep=no_wait)

    async def handler(seed: str | None) -> Response:
        return Response(b'{"push_id":"p1"}', status_code=202, media_type="application/json")

    request = Request({"type": "http", "method": "POST", "path": "/v1/multicast"})
    response = await once._run_claimed(request, "scope", "k1", "print", "token", handler)
    assert response.status_code == 202  # before: the failed write made it an error
    await wait_for(lambda: store.kept, "the answer kept", 2.0, every=0.005)
    assert store.kept == [Answer(202, b'{"push_id":"p1"}')]


async def test_a_shutdown_waits_for_an_answer_being_kept() -> None:
    """Before: nothing awaited the writes made later, so a shutdown during a failover
    dropped them (the key lapsed with its lease, and a retry ran the push again)."""
    store = FlakyWrites(failures=3)
    gate = asyncio.Event()

    async def slow(_: float) -> None:
        await gate.wait()

    once = Idempotency(store, wait_s=1.0, sleep=slow)
    await once._release("scope", "k1", "token")
    asyncio.get_running_loop().call_later(0.05, gate.set)
    await once.aclose(timeout_s=5.0)
    assert store.released == ["k1"]


async def test_a_shutdown_gives_up_a_write_past_its_bound_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyWrites(failures=3)

    async def never(_: float) -> None:
        await asyncio.Event().wait()

    once = Idempotency(store, wait_s=1.0, sleep=never)
    await once._release("scope", "k1", "token")
    with caplog.at_level("WARNING", "push_service.idempotency.http"):
        await once.aclose(timeout_s=0.05)
    assert store.released == [] and len(once._pending) == 0  # cancelled, not left running
    assert "gave up 1 Idempotency-Key writes at shutdown" in caplog.text
