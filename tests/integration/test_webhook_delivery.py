"""Webhook delivery: real `python -m push_service` processes send what the outbox holds
to a real HTTP receiver that checks every signature. Events are emitted through the real
sink (`RedisOutbox`), as the push service's producers do."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from router.processes.ports import free_port
from router.redis.client import RedisClient, connect_redis
from router.webhook.outbox import RedisOutbox
from shared.keys import KeySchema
from tests.integration.procs import push_services
from tests.integration.webhook_receiver import WebhookReceiver
from tests.integration.webhooks import HOOK_SECRET, env_for, metrics, metrics_once, unacked

pytestmark = pytest.mark.integration


@pytest.fixture
async def outbox_redis(redis_url: str) -> AsyncIterator[RedisClient]:
    async with connect_redis(redis_url) as client:
        yield client


async def test_500s_then_200_still_deliver_every_event_once(
    redis_url: str, prefix: str, tmp_path: Path, outbox_redis: RedisClient
) -> None:
    async with WebhookReceiver(HOOK_SECRET, statuses=[500, 503, 500]) as rx:
        port = free_port()
        async with push_services(env_for(redis_url, prefix, tmp_path, rx.url), [port]):
            await RedisOutbox(outbox_redis, KeySchema(prefix), 1000).emit(unacked(5))
            await rx.wait_for(lambda: len(rx.events) == 5, "the five events")
            counts = await metrics_once(port, "imroute_webhook_sent_total", 5)
    assert [status for status, _ in rx.requests] == [500, 503, 500, 200]
    assert all(n == 5 for _, n in rx.requests)  # one batch, retried whole
    assert sorted(e["event_id"] for e in rx.events) == [f"message.unacked:p{i}" for i in range(5)]
    assert rx.events[0]["uids"] == ["u0"] and rx.events[0]["preview"] == "hi"
    assert counts["imroute_webhook_sent_total"] == 5
    assert counts["imroute_webhook_retried_total"] == 3
    assert not rx.rejected and not rx.duplicates()


async def test_a_4xx_drops_its_batch_counted_and_the_next_is_sent(
    redis_url: str, prefix: str, tmp_path: Path, outbox_redis: RedisClient
) -> None:
    async with WebhookReceiver(HOOK_SECRET, statuses=[400]) as rx:
        port = free_port()
        outbox = RedisOutbox(outbox_redis, KeySchema(prefix), 1000)
        async with push_services(env_for(redis_url, prefix, tmp_path, rx.url), [port]) as (proc,):
            await outbox.emit(unacked(2))
            await rx.wait_for(lambda: len(rx.requests) == 1, "the refused request")
            await outbox.emit(unacked(1, start=2))
            await rx.wait_for(lambda: len(rx.events) == 1, "the next event")
            counts = await metrics_once(port, "imroute_webhook_sent_total", 1)
            log = "\n".join(proc.read_until("dropped (not retried)", 5))
    assert [e["event_id"] for e in rx.events] == ["message.unacked:p2"]
    assert counts["imroute_webhook_dropped_total"] == 2
    assert counts["imroute_webhook_retried_total"] == 0
    assert "refused 2 events with HTTP 400" in log
    assert HOOK_SECRET not in log


async def test_two_push_services_send_each_event_once(
    redis_url: str, prefix: str, tmp_path: Path, outbox_redis: RedisClient
) -> None:
    async with WebhookReceiver(HOOK_SECRET) as rx:
        ports = [free_port(), free_port()]
        outbox = RedisOutbox(outbox_redis, KeySchema(prefix), 10_000)
        async with push_services(env_for(redis_url, prefix, tmp_path, rx.url), ports):
            for start in range(0, 600, 150):
                await outbox.emit(unacked(150, start))
            await rx.wait_for(lambda: len(rx.events) >= 600, "600 events")
            deadline = time.monotonic() + 10
            while sum([(await metrics(p))["imroute_webhook_sent_total"] for p in ports]) != 600:
                assert time.monotonic() < deadline, "sent_total never reached 600"
                await asyncio.sleep(0.05)
    assert sorted(e["event_id"] for e in rx.events) == sorted(
        f"message.unacked:p{i}" for i in range(600)
    )
    assert not rx.duplicates() and not rx.rejected
    assert max(n for _, n in rx.requests) <= 100  # IMROUTE_WEBHOOK_BATCH_MAX


async def test_a_receiver_down_for_a_while_gets_every_queued_event_and_overflow_is_counted(
    redis_url: str, prefix: str, tmp_path: Path, outbox_redis: RedisClient, redis: aioredis.Redis
) -> None:
    rx = WebhookReceiver(HOOK_SECRET)  # not started: its port refuses connections
    port = free_port()
    env = env_for(redis_url, prefix, tmp_path, rx.url, IMROUTE_WEBHOOK_QUEUE_MAX="50")
    keys = KeySchema(prefix)
    async with push_services(env, [port]) as (proc,):
        await RedisOutbox(outbox_redis, keys, 50).emit(unacked(60))
        proc.read_until("retry 3 in", 15)  # the sender keeps trying, backing off
        deadline = time.monotonic() + 10
        while (counts := await metrics(port)).get("imroute_webhook_queue_length") != 50:
            assert time.monotonic() < deadline, counts
            await asyncio.sleep(0.1)
        assert counts["imroute_webhook_overflowed_total"] == 10
        assert counts["imroute_webhook_retried_total"] >= 3
        assert await redis.get(keys.webhook_overflow()) == "10"
        await rx.start()  # back
        try:
            await rx.wait_for(lambda: len(rx.events) == 50, "the 50 queued events")
        finally:
            await rx.stop()
        deadline = time.monotonic() + 10
        while await redis.xlen(keys.webhook_events()):  # delivered ones are deleted
            assert time.monotonic() < deadline, "the delivered events are still queued"
            await asyncio.sleep(0.05)
    assert sorted(e["event_id"] for e in rx.events) == sorted(
        f"message.unacked:p{i}"
        for i in range(50)  # the oldest kept, the newest refused
    )
    assert not rx.duplicates() and not rx.rejected


async def test_a_killed_senders_events_are_taken_over_by_another(
    redis_url: str, prefix: str, tmp_path: Path, outbox_redis: RedisClient
) -> None:
    async with WebhookReceiver(HOOK_SECRET, statuses=[500] * 10_000) as rx:
        env = env_for(redis_url, prefix, tmp_path, rx.url)
        async with push_services(env, [free_port()]) as (first,):
            await RedisOutbox(outbox_redis, KeySchema(prefix), 1000).emit(unacked(5))
            first.read_until("retry 1 in", 10)  # it holds the batch, retrying
            first.send_signal(signal.SIGKILL)
            await asyncio.to_thread(first.wait, 5)
        rx.statuses.clear()  # the receiver is healthy again
        tried = len(rx.requests)
        async with push_services(env, [free_port()]):
            # Idle past the claim time (2 x (timeout + max backoff) + 5 s, about 10 s
            # here), the dead sender's entries are claimed and sent.
            await rx.wait_for(lambda: len(rx.events) == 5, "the taken-over events", 25)
    assert len(rx.requests) == tried + 1
    assert sorted(e["event_id"] for e in rx.events) == [f"message.unacked:p{i}" for i in range(5)]
    assert not rx.duplicates() and not rx.rejected
