"""A job's receipt rides out a Redis that did not answer for a moment, and a write that
still fails is counted and logged while the job goes on (router.receipts.fanout)."""

from __future__ import annotations

import pytest
import redis.exceptions

from router.receipts.base import EXPIRED, QUEUED, NewReceipt
from router.receipts.fanout import FanoutReceipt
from router.redis.errors import redis_errors
from router.routes.base import RecipientGroups
from router.testing.stores import MemoryReceiptStore
from shared.errors import RegistryUnavailable


class Flaky(MemoryReceiptStore):
    """Fails its next `failures` writes: Redis silent, or answering `reply`."""

    def __init__(self, failures: int, reply: Exception | None = None) -> None:
        super().__init__()
        self.failures = failures
        self.reply = reply
        self.tries = 0

    async def record(self, receipt: NewReceipt, listable: bool, due_ms: int = 0) -> None:
        self.tries += 1
        if self.failures:
            self.failures -= 1
            if self.reply is None:
                raise RegistryUnavailable("redis did not answer: connection reset")
            with redis_errors():
                raise self.reply
        await super().record(receipt, listable, due_ms)


def receipt(store: Flaky) -> FanoutReceipt:
    return FanoutReceipt(store, "p1", "multicast", True, {})


async def test_a_chunk_recorded_through_a_blip_is_listed() -> None:
    store = Flaky(failures=1)
    r = receipt(store)
    await r.resolved(["a", "b"], RecipientGroups(1, {"g1": ["a"]}))
    assert store.tries == 2 and r.failed == 0
    assert store.receipts["p1"].states == {"a": QUEUED, "b": QUEUED}


async def test_a_write_redis_refuses_is_counted_logged_and_the_job_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Flaky(1, redis.exceptions.ResponseError("WRONGTYPE Operation against a key"))
    r = receipt(store)
    with caplog.at_level("WARNING", "router.receipts.fanout"):
        await r.resolved(["a"], RecipientGroups())  # raises nothing
    assert store.tries == 1 and r.failed == 1
    assert "could not write the receipt of push p1" in caplog.text
    await r.resolved(["b"], RecipientGroups())
    assert store.receipts["p1"].states == {"b": QUEUED} and r.recipients == 2


async def test_a_store_false_multicasts_offline_recipients_are_expired() -> None:
    """Nothing keeps it for a later connect, as for a P2P push (before: queued for good);
    resolved again (a job resumed from its checkpoint), the same."""
    store = MemoryReceiptStore()
    r = FanoutReceipt(store, "p1", "multicast", True, {}, None, stored=False)
    for _ in range(2):
        await r.resolved(["a", "b", "c"], RecipientGroups(1, {"g1": ["a"]}))
        assert store.receipts["p1"].states == {"a": QUEUED, "b": EXPIRED, "c": EXPIRED}
    counts = await store.counts("p1")
    assert counts is not None and (counts.queued, counts.expired) == (1, 2)
