"""Bus bytes and Redis memory of one broadcast: 1M recipients, 4 KiB of content.

    .venv/bin/python -m bench.bus_bytes [--users 1000000] [--content 4096] [--json]
        [--topic-log bus|apart]

The broadcast runs as the push service runs it (`run_broadcast` -> `BatchPublisher`
with the recovery log -> `RedisStreamsBus`), from synthetic directory pages of 1000
uids (`u0000000`, ...), without a push service process or gateways. A consumer group
that never reads stands for a gateway, so the stream keeps every entry (its MAXLEN is
set above the number of batches). Then it reports:

- the bytes published: each batch's data plus its attributes, as the bus carries them
  (what Pub/Sub would bill too);
- Redis memory, exact (`MEMORY USAGE ... SAMPLES 0`): the topic's stream, its batch log
  (`topiclog:{broadcast}`), and the stored content (`content:*`, after content-once);
- Redis commands and script calls per batch (`INFO commandstats` before and after: run
  it on an otherwise idle Redis).

`--topic-log bus` (the default) runs the stream as the topic's log, as the push service
does on the Redis Streams bus on its own Redis; `apart` logs each batch in the list
before publishing it, as on Pub/Sub (and as every version did before the stream was the
log).

It uses only what existed before content-once, so the same file runs against an older
checkout (`git archive <commit> | tar -x -C DIR`, copy this file into DIR/bench, run it
there) for the "before" figures. Its keys (a `bench:<random>:` prefix) are deleted at
the end. It needs a Redis at IMROUTE_REDIS_URL (default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.harness.counting import CountingPublisher
from router.bus.redis_streams import RedisStreamsBus, TopicLog, stream_key
from router.fanout.broadcast import run_broadcast
from router.fanout.publisher import BatchPublisher
from router.jobs.base import PushCounters
from router.recovery.base import RecoveryLimits
from router.recovery.store import RedisRecoveryStore
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import Message

PAGE = 1000


class MeteredBus(CountingPublisher):
    """The bus as BatchPublisher sees it, counting the bytes of every publish with its
    attributes (as Pub/Sub bills them)."""

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        self.bytes += sum(len(k) + len(v) for k, v in (attributes or {}).items())
        return await super().publish(topic, data, attributes)


async def pages(users: int) -> AsyncIterator[Sequence[str]]:
    for start in range(0, users, PAGE):
        yield [f"u{i:07d}" for i in range(start, min(users, start + PAGE))]


async def memory(redis: aioredis.Redis, key: str) -> int:
    return int(await redis.memory_usage(key, samples=0) or 0)


async def commandstats(redis: aioredis.Redis) -> tuple[int, int]:
    """(commands, script calls) Redis ran so far, these two INFO calls left out."""
    stats = await redis.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    scripts = calls.get("evalsha", 0) + calls.get("eval", 0)
    return sum(calls.values()) - calls.get("info", 0), scripts


async def run(url: str, users: int, content_bytes: int, on_bus: bool) -> dict[str, Any]:
    prefix = f"bench:{secrets.token_hex(4)}:"
    keys = KeySchema(prefix)
    redis = aioredis.Redis.from_url(url)
    text = '{"text":"' + "x" * max(0, content_bytes - 11) + '"}'
    message = Message(secrets.token_hex(16), secrets.token_hex(16), 0, "admin", text.encode(), 1)
    batches = -(-users // PAGE)
    try:
        limits = RecoveryLimits(topic_max=max(2000, batches + 10))
        store = RedisRecoveryStore(redis, keys, SystemClock(), limits, topics_on_bus=on_bus)
        topic_log = TopicLog(limits.window_ms, limits.topic_max) if on_bus else None
        async with RedisStreamsBus(url, prefix, maxlen=batches * 2, topic_log=topic_log) as bus:
            await bus.prepare(["broadcast"], "gw-meter")  # never reads: keeps everything
            metered = MeteredBus(bus)
            counters = PushCounters()
            publisher = BatchPublisher(metered, message, 0, counters, store)
            commands, scripts = await commandstats(redis)
            started = time.perf_counter()
            await run_broadcast(pages(users), publisher)
            seconds = time.perf_counter() - started
            commands_after, scripts_after = await commandstats(redis)
        content = 0
        async for key in redis.scan_iter(match=f"{prefix}content:*"):
            content += await memory(redis, key)
        stream = await memory(redis, stream_key(prefix, "broadcast"))
        tlog = await memory(redis, keys.topic_log("broadcast"))
        return {
            "users": users,
            "content_bytes": len(text),
            "batches": metered.count,
            "failed_batches": counters.failed_batches,
            "bus_bytes": metered.bytes,
            "stream_memory": stream,
            "tlog_memory": tlog,
            "content_memory": content,
            "redis_total": stream + tlog + content,
            "commands_per_batch": round((commands_after - commands) / metered.count, 2),
            "scripts_per_batch": round((scripts_after - scripts) / metered.count, 2),
            "publish_s": round(seconds, 2),
        }
    finally:
        async for key in redis.scan_iter(match=f"{prefix}*"):
            await redis.delete(key)
        await redis.aclose()


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=False,
        )
    except OSError:
        return "?"
    return out.stdout.strip() or "?"


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--users", type=int, default=1_000_000)
    p.add_argument("--content", type=int, default=4096, help="content bytes (JSON text)")
    p.add_argument("--label", default="", help="what this checkout is, for the report")
    p.add_argument("--json", action="store_true", help="one more line: every figure as JSON")
    p.add_argument(
        "--topic-log", choices=("bus", "apart"), default="bus", help="where batches are logged"
    )
    args = p.parse_args()
    url = os.environ.get("IMROUTE_REDIS_URL", "redis://127.0.0.1:6379/0")
    r = asyncio.run(run(url, args.users, args.content, args.topic_log == "bus"))
    label = args.label or commit()
    print(
        f"bus bytes, {label}: {r['users']:,} users, {r['batches']:,} batches, "
        f"{r['content_bytes']:,}-byte content, published in {r['publish_s']} s"
    )
    print(f"  bytes published:       {mb(r['bus_bytes'])}")
    print(f"  stream memory:         {mb(r['stream_memory'])}")
    print(f"  topic log memory:      {mb(r['tlog_memory'])}")
    print(f"  stored content memory: {r['content_memory']:,} B")
    print(f"  Redis, all three:      {mb(r['redis_total'])}")
    print(
        f"  per batch:             {r['commands_per_batch']} Redis commands, "
        f"{r['scripts_per_batch']} script calls"
    )
    if args.json:
        print(json.dumps({"label": label, **r}))


if __name__ == "__main__":
    main()
