"""Content once per push, on both buses: a broadcast's bus bytes are about its content
plus its uids, not batches x content; gateways still write every client the whole
content, and the topic log and resumes find it too."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack, aclosing

import pytest
import redis.asyncio as aioredis

from router.bus import BROADCAST
from router.bus.factory import open_bus
from router.bus.redis_streams import stream_key
from router.recovery.base import RecoveryLimits
from router.recovery.content import CACHE_ITEMS, ContentCache, RedisContentStore
from router.recovery.store import RedisRecoveryStore
from router.redis.client import connect_redis
from shared.batches import to_batch
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import Message
from shared.proto import gateway_pb2
from tests.bus_reads import take
from tests.integration.group_pushes import connect_all, finished, frames
from tests.integration.stack import AUTH, api, gateway

pytestmark = pytest.mark.integration

USERS = 2000
PAGE = 100  # IMROUTE_BATCH_SIZE: 20 batches
BATCHES = USERS // PAGE
CONTENT = {"text": "x" * 4096}  # 4 KiB
CONTENT_BYTES = len(json.dumps(CONTENT, separators=(",", ":")))
UIDS = [f"u{i:04d}" for i in range(USERS)]
UID_BYTES = sum(len(u) + 2 for u in UIDS)  # each with its protobuf tag and length
# What a batch costs besides its uids: ids, attributes, framing (about 250 bytes); the
# content is not among it. With the content in every batch, 20 x 4 KiB more.
PER_BATCH = 400


@pytest.fixture(params=["redis-streams", "pubsub"])
def bus_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    if request.param == "pubsub":
        return f"pubsub://{request.getfixturevalue('pubsub_project')}"
    return redis_url


async def test_a_broadcast_costs_the_bus_its_content_once(
    redis_url: str, prefix: str, redis: aioredis.Redis, bus_url: str
) -> None:
    online = UIDS[5::400]  # one user in each of 5 pages
    async with AsyncExitStack() as stack:
        meter = await stack.enter_async_context(open_bus(bus_url, prefix))
        # A subscriber that reads only at the end: it receives every batch as published.
        await meter.prepare([BROADCAST], "meter")
        gw = await stack.enter_async_context(
            gateway(redis_url, prefix, "gw1", "g1", bus_url=bus_url)
        )
        http = await stack.enter_async_context(
            api(redis_url, prefix, bus_url=bus_url, batch_size=PAGE)
        )
        users = [{"uid": uid, "tags": []} for uid in UIDS]
        assert (await http.put("/v1/users", json={"users": users}, headers=AUTH)).is_success
        sockets = await connect_all(stack, [gw], online)

        resp = await http.post("/v1/broadcast", json={"content": CONTENT}, headers=AUTH)
        job = await finished(http, resp.json()["push_id"])
        assert (job["status"], job["batches"], job["published"]) == ("done", BATCHES, BATCHES)

        got = await frames(sockets)
        assert {uid: [f["content"] for f in fs] for uid, fs in got.items()} == {
            uid: [CONTENT] for uid in online
        }

        async with aclosing(meter.subscribe([BROADCAST], "meter")) as messages:
            published = await take(messages, BATCHES)
        bus_bytes = sum(
            len(m.data) + sum(len(k) + len(v) for k, v in m.attributes.items()) for m in published
        )
        # About the uids plus a little per batch; the content is not in any of them.
        assert UID_BYTES < bus_bytes < UID_BYTES + BATCHES * PER_BATCH, bus_bytes
        for m in published:
            batch = gateway_pb2.Batch.FromString(m.data)
            assert batch.message.content_stored and not batch.message.content_json

    keys = KeySchema(prefix)
    msg_id = batch.message.msg_id
    assert await redis.strlen(keys.content(msg_id)) == CONTENT_BYTES  # stored once
    assert 0 < await redis.pttl(keys.content(msg_id)) <= 3900 * 1000
    tlog = await redis.memory_usage(keys.topic_log(BROADCAST), samples=0)
    if bus_url != redis_url:
        assert tlog is not None and tlog < UID_BYTES * 2 + BATCHES * PER_BATCH, tlog
    else:
        assert tlog is None  # the stream is the topic's log: the batches are written once
        stream = await redis.memory_usage(stream_key(prefix, BROADCAST), samples=0)
        # Listpack nodes and the groups cost about twice the data; 20 copies of the
        # content would cost more than all of it.
        assert stream is not None and stream < BATCHES * CONTENT_BYTES, stream


async def test_the_topic_log_gives_stored_content_back_and_leaves_out_what_is_gone(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    keys = KeySchema(prefix)
    store = RedisRecoveryStore(redis, keys, SystemClock(), RecoveryLimits())
    content = json.dumps(CONTENT).encode()
    assert store.content.stores(content) and not store.content.stores(b'"small"')
    seqs = []
    for msg_id in ("m1", "m2"):
        message = Message(msg_id, f"p-{msg_id}", 0, "admin", b"", 1)
        await store.content.hold(msg_id, content)
        batch = to_batch(message, ["a", "b"], f"b-{msg_id}")
        batch.message.content_stored = True
        batch.mode = gateway_pb2.MODE_BROADCAST
        seqs.append(await store.append_batch(BROADCAST, batch))
    raw = await redis.lrange(keys.topic_log(BROADCAST), 0, -1)
    assert all("xxxx" not in entry for entry in raw)  # the log holds no content

    history = await store.read_topic(BROADCAST, 0)
    assert [lb.message.content_json for lb in history.batches] == [content, content]

    await redis.delete(keys.content("m1"))  # past its TTL, or lost with Redis's data
    fresh = RedisRecoveryStore(redis, keys, SystemClock(), RecoveryLimits())  # no cache
    history = await fresh.read_topic(BROADCAST, 0)
    assert [lb.seq for lb in history.batches] == [seqs[1]]  # a hole where m1 was
    assert fresh.content_missing == 1


async def test_a_fill_of_more_contents_than_the_cache_holds_fills_them_all(
    redis_url: str, prefix: str
) -> None:
    """300 stored contents in one fill (a resume reads up to 1000 batches a topic): the
    cache keeps 256. Before, the first 44 fetched were pushed out before they were put
    back, counted missing and their batches dropped, though Redis had every one."""
    keys = KeySchema(prefix)
    async with connect_redis(redis_url) as client:
        store = RedisContentStore(client, keys, SystemClock(), 600, 1024)
        ids = [f"m{i:04d}" for i in range(CACHE_ITEMS + 44)]
        for msg_id in ids:
            await store.hold(msg_id, b'"' + b"x" * 2000 + b'"')
        batches = [
            gateway_pb2.Batch(message=gateway_pb2.Message(msg_id=m, content_stored=True))
            for m in ids
        ]
        cache = ContentCache(store)
        assert await cache.fill(batches) == [True] * len(ids)
        assert cache.missing == 0
        assert all(b.message.content_json.startswith(b'"xx') for b in batches)
        await client.delete(*[keys.content(m) for m in ids])
