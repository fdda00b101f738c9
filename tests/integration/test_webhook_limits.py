"""A hostile webhook receiver cannot stall or swell the sender: a real `python -m
push_service` POSTs to a raw receiver on loopback that floods or drips its answers. The
sender reads a few KiB of an answer at most, and gives a POST IMROUTE_WEBHOOK_TIMEOUT_S
in all (connect, send, answer); a POST without an answer by then is retried."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from router.processes.ports import free_port
from router.redis.client import connect_redis
from router.webhook.outbox import RedisOutbox
from shared.keys import KeySchema
from tests.integration.hostile_receiver import OK, Drip, Flood, HostileReceiver
from tests.integration.procs import push_services
from tests.integration.webhooks import HOOK_SECRET, env_for, metrics, metrics_once, unacked

pytestmark = pytest.mark.integration

MiB = 1 << 20
CUT_DEADLINE = 'imroute_webhook_cut_total{reason="deadline"}'
CUT_LONG = 'imroute_webhook_cut_total{reason="long_answer"}'


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def emit(redis_url: str, prefix: str, n: int, start: int = 0) -> None:
    async with connect_redis(redis_url) as client:
        await RedisOutbox(client, KeySchema(prefix), 1000).emit(unacked(n, start))


async def test_a_receiver_flooding_its_answer_costs_the_sender_a_few_kib_and_is_retried(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    # A 500 with an endless body, then a good answer. The deadline (10 s) is far away:
    # what ends the flood is the sender's cap on what it reads of an answer.
    async with HostileReceiver(HOOK_SECRET, [Flood(500), OK]) as rx:
        port = free_port()
        env = {**env_for(redis_url, prefix, tmp_path, rx.url), "IMROUTE_WEBHOOK_TIMEOUT_S": "10"}
        async with push_services(env, [port]) as (proc,):
            await metrics(port)
            base = peak = rss_mb(proc.pid)
            await emit(redis_url, prefix, 3)
            deadline = time.monotonic() + 20
            while len(rx.events) < 3:
                peak = max(peak, rss_mb(proc.pid))
                sent = rx.conns[0].sent if rx.conns else 0
                assert peak < base + 50, f"RSS {base:.0f} -> {peak:.0f} MB, {sent} bytes sent"
                assert time.monotonic() < deadline, rx.conns
                await asyncio.sleep(0.05)
            counts = await metrics_once(port, "imroute_webhook_sent_total", 3)
            log = "\n".join(proc.read_until("cut off", 5))
    flood = rx.conns[0]
    assert flood.closed is not None and flood.closed - flood.requested < 2, flood
    assert flood.sent < 32 * MiB, flood  # socket buffers; the sender read 4 KiB of it
    assert [c.events for c in rx.conns] == [3, 3]  # the same batch, retried once
    assert counts["imroute_webhook_retried_total"] == 1
    assert counts[CUT_LONG] == 1 and counts[CUT_DEADLINE] == 0
    assert "HTTP 500" in log and HOOK_SECRET not in log
    assert not rx.rejected
    took = flood.closed - flood.requested
    print(f"RSS {base:.0f} MB, peak {peak:.0f} MB; flood: {flood.sent} bytes, cut in {took:.2f}s")


async def test_a_receiver_dripping_its_answer_is_cut_at_the_deadline_and_the_queue_moves_on(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    # A byte every 2 s never trips a per-read timeout of 3 s; the total deadline cuts it.
    # First the head drips (no answer: retried), then a 200's body drips (answered:
    # delivered, the rest of the body not waited for), then a later batch goes through.
    async with HostileReceiver(HOOK_SECRET, [Drip(head=True), Drip(head=False), OK]) as rx:
        port = free_port()
        env = {**env_for(redis_url, prefix, tmp_path, rx.url), "IMROUTE_WEBHOOK_TIMEOUT_S": "3"}
        async with push_services(env, [port]) as (proc,):
            await emit(redis_url, prefix, 2)
            await rx.wait_for(lambda: len(rx.conns) >= 2 and rx.conns[1].closed, "two cuts", 15)
            await emit(redis_url, prefix, 1, start=2)
            await rx.wait_for(lambda: len(rx.events) == 1, "the later event", 10)
            counts = await metrics_once(port, "imroute_webhook_sent_total", 3)
            log = "\n".join(proc.read_until("cut off", 5))
    head, body, _ = rx.conns
    assert head.closed is not None and body.closed is not None
    for conn, closed in ((head, head.closed), (body, body.closed)):
        assert 2.5 < closed - conn.requested < 5.0, conn  # the 3 s deadline, in all
    assert body.requested >= head.closed  # the retry, once the first POST was cut
    assert [c.events for c in rx.conns] == [2, 2, 1]
    assert [e["event_id"] for e in rx.events] == ["message.unacked:p2"]
    assert counts["imroute_webhook_retried_total"] == 1
    assert counts[CUT_DEADLINE] == 1 and counts[CUT_LONG] == 1
    assert "no answer within 3s" in log and HOOK_SECRET not in log
    assert not rx.rejected
