"""What one resume may read, end to end: a Redis of the test's own (so `INFO stats`
counts only this test's bytes), a gateway process, the push API, real WebSocket clients.

Two group logs hold 100 multicast batches of 1000 64-character uids each (about 70 KB a
batch, 7 MB a log), written before the gateway starts. A client with a valid token that
names an old place in them (its own group's, or another group's) used to make the
gateway read the whole log from Redis: 7 MB for a 400-byte handshake. Now it reads
within the budget from the head and is told `complete: false`; legitimate resumes stay
complete; resumes from nearby places share one read per range; and a user's resumes
past its rate read nothing.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection, connect

from router.bus.base import NEXT_SEQ, SEQ, group_topic
from router.bus.factory import open_bus
from router.bus.redis_streams import TopicLog
from router.processes.ports import free_port_block
from router.recovery.base import OFFLINE_TOPIC, RecoveryLimits
from router.recovery.store import RedisRecoveryStore
from router.redis.client import connect_redis
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.positions import counter_of, decode_pos, epoch_of
from shared.proto import gateway_pb2
from socket_gateway.topic_spans import SPAN_TTL_S
from tests.integration.procs import BIN, Proc, gateway_env, read_until, running
from tests.integration.recovery_helpers import pushes, replay
from tests.integration.redis_process import RedisProcess, redis_process
from tests.integration.stack import api, contents, fanout, p2p, token

pytestmark = pytest.mark.integration

BATCHES = 100
UIDS_PER_BATCH = 1000


@dataclass
class Stack:
    redis: RedisProcess
    client: aioredis.Redis
    prefix: str
    ws_url: str
    metrics_url: str
    heads: dict[str, int]  # group -> the seq of its log's last filled batch

    async def sent(self) -> int:
        """Bytes Redis has written to its clients so far."""
        info = await self.client.info("stats")
        return int(info["total_net_output_bytes"])

    async def usec(self, command: str) -> int:
        """Microseconds Redis spent in `command` (scripts' own calls counted too)."""
        stats = await self.client.info("commandstats")
        return int(stats.get(f"cmdstat_{command}", {}).get("usec", 0))

    async def metric(self, name: str) -> float:
        async with httpx.AsyncClient() as http:
            text = (await http.get(self.metrics_url)).text
        match = re.search(rf"^imroute_gateway_{name}_total (\S+)$", text, re.M)
        assert match, text
        return float(match.group(1))

    async def resume(self, uid: str, since: str | None) -> tuple[list[Any], Any, ClientConnection]:
        url = f"{self.ws_url}?token={token(uid)}" + (f"&since={since}" if since else "")
        ws = await connect(url, max_size=None)
        got, end = await replay(ws)
        return got, end, ws


async def _followed(s: Stack, http: httpx.AsyncClient, topic: str) -> None:
    """Until the gateway has followed `topic`'s log to its head (a fixed sleep was not
    enough on a loaded machine): the `pos` a live probe client is handed says how far."""
    head = int(await s.client.hget(KeySchema(s.prefix).topic_seq(topic), "n") or 0)
    _, _, probe = await s.resume("probe", None)
    try:
        for n in range(200):
            await p2p(http, ["probe"], n)
            (frame,) = await pushes(probe, 1)
            pos = decode_pos(frame["pos"])
            assert pos is not None, frame
            if counter_of(pos.o) >= head:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the gateway did not follow {topic} to {head}")
    finally:
        await probe.close()


def since(group: str, g: int, o: int = 0) -> str:
    """A position at `g` in `group`'s log (and `o` in the offline log's), nothing else."""
    at = f"{counter_of(o)}.{epoch_of(o)}"
    return f"2~0.0~0.0~{at}~{group}~{counter_of(g)}.{epoch_of(g)}"


async def _fill(url: str, prefix: str, group: str) -> int:
    """BATCHES sizeable multicast batches into `group`'s log, as a push service logs
    them (published on the bus, whose stream is the log); the last one's seq."""
    now = int(time.time() * 1000)
    limits = RecoveryLimits()
    topic_log = TopicLog(limits.window_ms, limits.topic_max)
    async with connect_redis(url) as client, open_bus(url, prefix, topic_log=topic_log) as bus:
        store = RedisRecoveryStore(client, KeySchema(prefix), SystemClock(), limits)
        for n in range(BATCHES):
            batch = gateway_pb2.Batch(
                batch_id=f"{group}-{n}",
                message=gateway_pb2.Message(
                    msg_id=f"{group}-m{n}",
                    push_id=f"{group}-p{n}",
                    content_json=b'"x"',
                    ts_ms=now,
                ),
                uids=[f"{group}-{n}-{i:04d}".ljust(64, "u") for i in range(UIDS_PER_BATCH)],
                mode=gateway_pb2.MODE_MULTICAST,
                group_id=group,
            )
            attributes = {"batch_id": batch.batch_id, SEQ: NEXT_SEQ}  # logged: placed
            await bus.publish(group_topic(group), batch.SerializeToString(), attributes)
        [seq] = await store.heads([group_topic(group)])
    return seq


@contextmanager
def _gateway(url: str, prefix: str, metrics_port: int, **env: str) -> Iterator[Proc]:
    argv = [str(BIN / "python"), "-m", "socket_gateway", "--ws-port", "0", "--grpc-port", "0"]
    with running(
        argv,
        gateway_env(
            url,
            prefix,
            IMROUTE_GATEWAY_ID="gw1",
            IMROUTE_GROUP_ID="g1",
            IMROUTE_METRICS_PORT=str(metrics_port),
            **env,
        ),
    ) as proc:
        yield proc


@asynccontextmanager
async def stack(prefix: str, **env: str) -> AsyncIterator[Stack]:
    with redis_process() as server:
        heads = {g: await _fill(server.url, prefix, g) for g in ("g1", "g2")}
        port = free_port_block([0])
        with _gateway(server.url, prefix, port, **env) as gw:
            line = (await asyncio.to_thread(read_until, gw, " ready ", 60))[-1]
            ws_url = re.search(r"ws=(\S+)", line)
            assert ws_url, line
            client = aioredis.from_url(server.url, decode_responses=True)
            try:
                yield Stack(
                    server, client, prefix, ws_url.group(1),
                    f"http://127.0.0.1:{port}/metrics", heads,
                )  # fmt: skip
            finally:
                await client.aclose()


async def test_a_forged_since_reads_kilobytes_and_is_told_complete_false(prefix: str) -> None:
    async with stack(prefix) as s, api(s.redis.url, s.prefix) as http:
        # Legitimate first: a client that was away while two multicasts named it (and
        # one named only a user still online in its group) gets them, completely.
        _, end, bob = await s.resume("bob", None)
        _, end, ws = await s.resume("amy", None)
        assert end["complete"] is True
        await fanout(http, "/v1/multicast", {"to": ["amy", "bob"], "content": "one"})
        (first,) = await pushes(ws, 1)
        await pushes(bob, 1)
        await ws.close()
        await asyncio.sleep(0.3)  # amy's route is gone: what follows goes to `offline`
        for text in ("two", "three"):
            await fanout(http, "/v1/multicast", {"to": ["amy", "bob"], "content": text})
        await pushes(bob, 2)
        before = await s.sent()
        got, end, ws = await s.resume("amy", first["pos"])
        legit = await s.sent() - before
        assert contents(got) == ["two", "three"] and end["complete"] is True
        await ws.close()

        # A forged old place in its own group's log (7 MB behind the head), then in
        # another group's: the budget read backward from the head, once per log (1 MiB,
        # kept for the resumes that need it), then a few KB for each, and complete:false.
        forgeries = {
            "mallory": since("g1", s.heads["g1"] - BATCHES + 1),
            "mal": since("g2", s.heads["g2"] - BATCHES + 1),
            "mallet": since("g1", s.heads["g1"] - BATCHES + 2),
            "malo": since("g2", s.heads["g2"] - BATCHES + 2),
        }
        took: dict[str, tuple[float, float]] = {}  # each resume's start and end
        for n, (uid, forged) in enumerate(forgeries.items()):
            before = await s.sent()
            start = time.monotonic()
            got, end, ws = await s.resume(uid, forged)
            took[uid] = (start, time.monotonic())
            read = await s.sent() - before
            assert (got, end["complete"]) == ([], False), forged
            most = (1 << 20) + 80_000 if n < 2 else 64_000  # the budget and one entry
            assert read < most, f"{read} bytes read from Redis for {forged}"
            # The connection is served as any other from now on.
            await p2p(http, [uid], "live")
            (live,) = await pushes(ws, 1)
            assert live["content"] == "live"
            await ws.close()
        assert await s.metric("resume_topics_over_budget") == 4
        # The legitimate one, and one a log: each log's second forged place uses what the
        # first found while that is fresh (SPAN_TTL_S). On a machine so loaded that the
        # two were further apart, the second reads that log once more.
        stale = sum(
            took[second][1] - took[first][0] > SPAN_TTL_S
            for first, second in (("mallory", "mallet"), ("mal", "malo"))
        )
        assert await s.metric("resume_topic_reads") <= 3 + stale, took

        # A place no gateway of g2 gave out (0, in a log that has batches): not read.
        before = await s.sent()
        got, end, ws = await s.resume("mel", since("g2", 0))
        assert (got, end["complete"]) == ([], False)
        assert await s.sent() - before < 64_000
        assert await s.metric("resume_moves_refused") == 1
        await ws.close()
        assert legit < 64_000, legit


async def test_resumes_from_nearby_places_share_one_read_per_range(prefix: str) -> None:
    """50 clients resume at once from 10 places 1 to 10 batches behind the head: Redis
    sends those 10 batches about once (each client reading its own range: 5.5 times)."""
    async with stack(prefix) as s:
        head = s.heads["g1"]
        before = await s.sent()
        results = await asyncio.gather(
            *(s.resume(f"c{i}", since("g1", head - 1 - i % 10)) for i in range(50))
        )
        read = await s.sent() - before
        assert all(end["complete"] is True for _, end, _ in results)
        assert all(got == [] for got, _, _ in results)  # none of them was named
        stream = KeySchema(prefix).bus_stream(group_topic("g1"))
        raw = aioredis.from_url(s.redis.url)  # the batches are bytes, not text
        try:
            newest: Any = await raw.xrevrange(stream, count=10)
            ten = sum(len(fields[b"data"]) for _, fields in newest)
        finally:
            await raw.aclose()
        # Each client's own handshake costs Redis about 1 KB (route, user, heads).
        assert read < 1.5 * ten + 50 * 2_000, f"{read} bytes for {ten} bytes of batches"
        # One read of a place at most, however the 50 handshakes interleave, while the
        # span is used within SPAN_TTL_S (each read adds to it what it lacked, below its
        # bottom; none reads what one before it brought): 2 when they all arrive during
        # the first read (tests/unit/test_topic_spans.py), more when a loaded machine
        # spreads them out; 50 if nothing were shared. The bytes above are the budget.
        assert await s.metric("resume_topic_reads") <= 10
        for _, _, ws in results:
            await ws.close()


async def test_forged_places_stepped_forward_cost_redis_one_budgeted_read(prefix: str) -> None:
    """50 accounts each name a place one batch further than the last (99, 98, ... 50
    behind the head, 7 to 3.5 MB): the first read runs out of budget, the place where it
    did is kept, and every later one is below it: refused unread. Redis's own time is
    counted (commandstats), not only the bytes it sent."""
    async with stack(prefix) as s:
        head = s.heads["g1"]
        await s.client.config_resetstat()
        before = await s.sent()
        for k in range(50):
            got, end, ws = await s.resume(f"m{k}", since("g1", head - 99 + k))
            assert (got, end["complete"]) == ([], False)
            await ws.close()
        read = await s.sent() - before
        lrange, scripts = await s.usec("lrange"), await s.usec("evalsha")
        print(f"50 stepped places: scripts {scripts} us, lrange {lrange} us, {read} bytes")
        assert await s.metric("resume_topic_reads") == 1
        assert await s.metric("resume_topics_over_budget") == 50
        # One budgeted read: about 2 ms of Redis; each client's own handshake some 100 us.
        assert scripts < 100_000 and lrange < 10_000, (scripts, lrange)
        assert read < (1 << 20) + 80_000 + 50 * 4_000, read


async def test_resumes_past_a_users_rate_read_nothing_and_are_told_complete_false(
    prefix: str,
) -> None:
    rate = {
        "IMROUTE_RECOVERY_RESUME_BURST_PER_UID": "2",
        "IMROUTE_RECOVERY_RESUME_RATE_PER_UID": "0.01",
    }
    async with stack(prefix, **rate) as s, api(s.redis.url, s.prefix) as http:
        place = since("g1", s.heads["g1"] - 3)
        for _ in range(2):
            got, end, ws = await s.resume("rita", place)
            assert (got, end["complete"]) == ([], True)
            await ws.close()
        await p2p(http, ["rita"], "queued", store=True)  # offline: into her inbox
        await asyncio.sleep(2.5)  # past SPAN_TTL_S: no read of the place is held any more
        before = await s.sent()
        got, end, ws = await s.resume("rita", place)
        read = await s.sent() - before
        # Served as a new connection: its inbox, no position read, complete:false.
        assert contents(got) == ["queued"] and end["complete"] is False
        assert read < 16_000, f"{read} bytes from Redis (3 batches: about 200 KB)"
        assert await s.metric("resumes_rate_limited") == 1
        await ws.close()
        _, end, ws = await s.resume("ruth", place)  # another user: its own bucket
        assert end["complete"] is True
        await ws.close()


async def test_a_resume_reads_from_the_log_only_what_is_older_than_memory(prefix: str) -> None:
    """A client away while 79 multicasts named it (into the offline log, which the
    gateway follows and holds the last 64 of in memory) gets all 79, and only the 15
    older than memory are read from Redis."""
    async with stack(prefix) as s, api(s.redis.url, s.prefix) as http:
        _, _, ws = await s.resume("amy", None)
        await fanout(http, "/v1/multicast", {"to": ["amy"], "content": 0})
        (first,) = await pushes(ws, 1)
        await ws.close()
        await asyncio.sleep(0.3)  # amy's route is gone: what follows goes to `offline`
        for n in range(1, 80):
            await fanout(http, "/v1/multicast", {"to": ["amy"], "content": n})
        await _followed(s, http, OFFLINE_TOPIC)  # it holds the offline log's last 64
        before = await s.metric("resume_topic_read_bytes")
        got, end, ws = await s.resume("amy", first["pos"])
        assert contents(got) == list(range(1, 80)) and end["complete"] is True
        log = KeySchema(prefix).topic_log(OFFLINE_TOPIC)
        entry = max(len(e) for e in await s.client.lrange(log, -79, -1))
        read = await s.metric("resume_topic_read_bytes") - before
        assert read <= 15 * entry, f"{read} bytes for 15 entries of at most {entry}"
        await ws.close()


async def test_past_its_rate_a_resume_still_stands_at_its_own_position(prefix: str) -> None:
    """Past the rate only the topic logs are not read: the P2P messages its position
    already covers are not sent again (its inbox is not replayed whole)."""
    rate = {
        "IMROUTE_RECOVERY_RESUME_BURST_PER_UID": "1",
        "IMROUTE_RECOVERY_RESUME_RATE_PER_UID": "0.01",
    }
    async with stack(prefix, **rate) as s, api(s.redis.url, s.prefix) as http:
        _, _, ws = await s.resume("rosa", since("g1", s.heads["g1"]))  # its one token
        await p2p(http, ["rosa"], "seen")
        (seen,) = await pushes(ws, 1)
        await ws.close()
        await asyncio.sleep(0.3)
        await p2p(http, ["rosa"], "queued", store=True)
        got, end, ws = await s.resume("rosa", seen["pos"])
        # Nothing in the topic logs after its place (each stands at its head): complete.
        assert contents(got) == ["queued"] and end["complete"] is True
        assert await s.metric("resumes_rate_limited") == 1
        await ws.close()
