"""The webhook sender against faults an audit found it did not survive, on real Redis
(the receiver is httpx's mock transport: the faults are the sender's own handling).

- a POST that fails with an error the exchange does not expect (a bug) ended the
  sender's task, silently, until shutdown;
- Redis losing the outbox stream while the sender backed off left it retrying its
  touch (NOGROUP) for ever, delivering nothing more;
- a batch split into POSTs touched only the part being retried: the later parts went
  idle, and a second, live sender took them over and sent them twice.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from router.redis.client import RedisClient, connect_redis
from router.webhook.base import Event
from router.webhook.consumer import GROUP
from router.webhook.outbox import RedisOutbox
from router.webhook.sender import WebhookSender
from shared.clock import SystemClock
from shared.keys import KeySchema
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
async def client(redis_url: str, prefix: str) -> AsyncIterator[RedisClient]:
    async with connect_redis(redis_url) as redis:
        yield redis
        keys = KeySchema(prefix)
        await redis.delete(keys.webhook_events(), keys.webhook_overflow())


def sender(
    redis: RedisClient, prefix: str, handler: Handler, backoff_max_s: float = 0.1
) -> tuple[WebhookSender, RedisOutbox]:
    keys = KeySchema(prefix)
    outbox = RedisOutbox(redis, keys, 1000)
    s = WebhookSender(
        redis,
        keys,
        outbox,
        SystemClock(),
        url="http://rx/hooks",
        secret="whsec-test-0123456789",
        timeout_s=1.0,
        batch_max=10,
        backoff_max_s=backoff_max_s,
        transport=httpx.MockTransport(handler),
    )
    return s, outbox


def answer(status: int) -> httpx.Response:
    """Streamed, as a real transport's (the exchange reads it as a stream)."""
    return httpx.Response(status, stream=httpx.ByteStream(b""))


def event_ids(request: httpx.Request) -> list[str]:
    return [e["event_id"] for e in json.loads(request.content)["events"]]


def event(event_id: str, **data: Any) -> Event:
    return Event("message.unacked", event_id, int(time.time() * 1000), data)


async def test_a_bug_in_a_post_is_logged_and_the_sender_goes_on(
    client: RedisClient, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    sent: list[list[str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        ids = event_ids(request)
        if ids == ["e1"]:
            raise RuntimeError("a bug below the exchange")
        sent.append(ids)
        return answer(200)

    s, outbox = sender(client, prefix, handler)
    with caplog.at_level("ERROR", "router.webhook.sender"):
        async with s.running():
            await outbox.emit([event("e1")])
            await wait_for(lambda: "failed delivering a batch" in caplog.text, "the bug logged")
            await outbox.emit([event("e2")])
            await wait_for(lambda: sent == [["e2"]], "the next event sent", 5.0)
    assert s.sent == 1


async def test_a_stream_redis_lost_during_a_backoff_does_not_stop_the_sender(
    client: RedisClient, prefix: str
) -> None:
    keys = KeySchema(prefix)
    sent: list[list[str]] = []
    healthy = asyncio.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        if not healthy.is_set():
            return answer(503)
        sent.append(event_ids(request))
        return answer(200)

    s, outbox = sender(client, prefix, handler)
    async with s.running():
        await outbox.emit([event("e1")])
        await wait_for(lambda: s.retried >= 2, "the sender backing off")
        await client.delete(keys.webhook_events())  # Redis restarted empty, say
        await outbox.emit([event("e2")])  # producers go on (XADD makes the stream again)
        healthy.set()
        # e1 (in memory) goes once it is answered; e2 is read from the remade group.
        await wait_for(lambda: ["e2"] in sent, "the event added after the loss sent", 10.0)
    assert sent[0] == ["e1"] and sent.count(["e2"]) == 1


async def test_the_later_parts_of_a_split_batch_are_held_while_the_first_is_retried(
    client: RedisClient, prefix: str
) -> None:
    keys = KeySchema(prefix)
    refusing = True

    def handler(request: httpx.Request) -> httpx.Response:
        return answer(503 if refusing and "big-1" in event_ids(request) else 200)

    s, outbox = sender(client, prefix, handler)
    pad = "x" * 600_000  # two such events do not fit one POST (1 MiB)
    async with s.running():
        await outbox.emit([event(f"big-{i}", pad=pad) for i in (1, 2)])
        await wait_for(lambda: s.retried >= 1, "the first part retried")
        await asyncio.sleep(1.5)
        pending = await client.xpending_range(keys.webhook_events(), GROUP, "-", "+", 10)
        idle = {p["message_id"]: int(p["time_since_delivered"]) for p in pending}
        assert len(idle) == 2, pending
        first, second = sorted(idle)  # entry ids grow: big-1's first
        # Touched together: before, big-2 was idle since it was read (1.5 s and more),
        # and a second sender would take it over once past claim_idle_ms.
        assert idle[second] - idle[first] < 500, idle
        refusing = False
        await wait_for(lambda: s.sent == 2, "both sent", 5.0)


async def test_a_busy_receiver_is_retried_after_the_wait_it_asks_for(
    client: RedisClient, prefix: str
) -> None:
    """429 with Retry-After: 1 (the first backoff alone is 0.25-0.5 s); at most
    IMROUTE_WEBHOOK_BACKOFF_MAX_S. Before, Retry-After was not read."""
    posts: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(time.monotonic())
        if len(posts) == 1:
            return httpx.Response(429, headers={"Retry-After": "1"}, stream=httpx.ByteStream(b""))
        return answer(200)

    s, outbox = sender(client, prefix, handler, backoff_max_s=5.0)
    async with s.running():
        await outbox.emit([event("e1")])
        await wait_for(lambda: s.sent == 1, "sent after the wait", 5.0)
    assert 0.95 <= posts[1] - posts[0] < 2.0, posts
