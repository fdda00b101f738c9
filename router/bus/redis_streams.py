"""The embedded default bus: one Redis stream per topic, one consumer group per subscriber.

Publishing is one script per attempt: the XADD, and the trim that never drops what a
live subscriber has not read within the bound, and counts what it drops past it
(`redis_trim`); its retries and hedges are the wrapper's (`RedisStreamsBus` is
`HedgedBus` around `RedisStreamsTransport`). Each subscriber (a gateway id) owns a
consumer group on each of its topics' streams, created at `$`, so it gets every entry
published after that, independently of every other subscriber. An entry stays pending
in the group until the subscriber acks it (XACK): a subscriber first re-reads its own
pending entries (ID 0), then reads new ones (`>`), and now and then XAUTOCLAIMs entries
idle for `claim_idle_s`: those left by another consumer name of its group, and its own
that were never acked (like Pub/Sub's ack deadline, such an entry comes again).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Unpack

import redis.asyncio as aioredis
import redis.exceptions
from redis.typing import KeyT, StreamIdT

from router.bus.base import BusLifecycle, BusUnavailable, Received, validate_subscription
from router.bus.hedged import HedgedBus, Publishing, split_publishing
from router.bus.losses import BusLosses
from router.bus.redis_trim import LOST_TTL_MS, MAX_EXCESS, PUBLISH, TrimReporter, parse_reply
from router.bus.redis_trim import text as _text
from router.hedging import Attempt, AttemptContext
from router.redis.client import connection_identity
from router.redis.errors import is_transient, redis_errors, reraise_swallowed_cancel
from router.redis.scripts import ScriptRunner
from shared.backoff import backoff_s
from shared.keys import KeySchema
from shared.urls import unreadable_url

__all__ = [
    "DEFAULT_MAXLEN",
    "RedisStreamsBus",
    "RedisStreamsBusOptions",
    "RedisStreamsTransport",
    "TopicLog",
    "stream_key",
]

log = logging.getLogger(__name__)

DEFAULT_MAXLEN = 10_000
DEFAULT_GROUP_IDLE_S = 600.0
# How often a topic's publisher looks at its groups while the stream is within the bound.
TRIM_EVERY_S = 1.0
POOL_SIZE = 64
POOL_WAIT_S = 5.0
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 5.0
# A dead peer (not a closed socket) must surface as an error, but never before a
# blocking read's own timeout.
SOCKET_SLACK_S = 5.0
# One read takes at most this share of the bound: what a live gateway holds read and not
# yet acked stays far inside the bound, so a trim past it does not count a running
# gateway's entries in hand as lost (100 at the default bound, 5 at a bound of 50).
READ_SHARE_OF_BOUND = 10

_DATA = b"data"
_ATTR = b"attr:"
_NO_CURSOR = b"0-0"


def stream_key(prefix: str, topic: str) -> str:
    """The stream holding one topic's messages (the format lives in shared.keys)."""
    return KeySchema(prefix).bus_stream(topic)


class TopicLog(NamedTuple):
    """The stream as its topic's recovery log: what it keeps for resumes beyond what the
    live groups need (IMROUTE_RECOVERY_WINDOW_S, IMROUTE_RECOVERY_TOPIC_MAX)."""

    window_ms: int
    max_entries: int


class RedisStreamsBusOptions(Publishing, total=False):
    """RedisStreamsBus's keyword arguments: Publishing's, then RedisStreamsTransport's."""

    maxlen: int
    group_idle_s: float
    block_s: float
    count: int
    claim_idle_s: float
    consumer: str | None
    pool_size: int
    topic_log: TopicLog | None


class RedisStreamsTransport(BusLifecycle):
    """The Redis Streams transport, on the Redis imroute already runs."""

    message_ordering = False

    def __init__(
        self,
        url: str,
        prefix: str = "imroute:",
        *,
        maxlen: int = DEFAULT_MAXLEN,
        group_idle_s: float = DEFAULT_GROUP_IDLE_S,
        block_s: float = 1.0,
        count: int = 100,
        claim_idle_s: float = 30.0,
        consumer: str | None = None,
        pool_size: int = POOL_SIZE,
        topic_log: TopicLog | None = None,
    ) -> None:
        """`topic_log`: each topic's stream is its recovery log too (on the Redis the
        recovery store uses): a publish gives the entry its seq under the topic's
        sequence, in the same script, and the trim keeps the log's window. `count`: the
        entries one read takes at most (and at most a tenth of `maxlen`)."""
        try:
            # Binary payloads, so no decoding; a blocking pool makes a burst of
            # publishers wait for a connection instead of failing at once.
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=pool_size,
                timeout=POOL_WAIT_S,
                decode_responses=False,
                health_check_interval=30,
                socket_connect_timeout=SOCKET_SLACK_S,
                socket_timeout=block_s + SOCKET_SLACK_S,
                **connection_identity(),
            )
        except ValueError as exc:
            raise unreadable_url("IMROUTE_BUS_URL", url, exc) from None
        self._redis: aioredis.Redis = aioredis.Redis.from_pool(pool)
        self._prefix = prefix
        self._keys = KeySchema(prefix)
        self._maxlen = maxlen
        self._topic_log = topic_log
        self.logs_topics = topic_log is not None
        self._group_idle_ms = int(group_idle_s * 1000)
        self._scripts = ScriptRunner(self._redis, (PUBLISH,))
        self._checked: dict[str, float] = {}  # topic -> when its groups were last looked at
        self._trims = TrimReporter(maxlen, group_idle_s)
        self.losses: BusLosses = self._trims.losses
        self._block_ms = max(1, int(block_s * 1000))
        self._stalled_s = block_s + SOCKET_SLACK_S
        self._count = max(1, min(count, maxlen // READ_SHARE_OF_BOUND))
        self._claim_idle_ms = int(claim_idle_s * 1000)
        # None: each subscriber reads under its own id, so a restart finds its pending
        # entries at once; a per-boot name leaves them to XAUTOCLAIM instead.
        self._consumer = consumer
        super().__init__()

    async def attempt(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> Attempt[str]:
        """The publish script (an XADD and the trim) on the topic's stream; it returns
        the entry id."""
        self.check_open()
        fields: list[bytes] = [_DATA, data]
        for name, value in attributes.items():
            fields += (_ATTR + name.encode(), value.encode())
        keys = [self._keys.bus_stream(topic), self._keys.bus_lost(topic)]
        log_bounds = (0, 0)
        if self._topic_log is not None:
            keys.append(self._keys.topic_seq(topic))
            log_bounds = self._topic_log

        async def xadd(ctx: AttemptContext) -> str:
            # A hedge is one more XADD of the same batch: a duplicate entry that the
            # gateways drop by batch id (as the topic's log, the script answers with
            # the entry it already is while it is the topic's last). A loser is
            # cancelled mid-command.
            now = asyncio.get_running_loop().time()
            check = now - self._checked.get(topic, -TRIM_EVERY_S) >= TRIM_EVERY_S
            if check:
                self._checked[topic] = now
            args = [
                self._maxlen,
                self._group_idle_ms,
                int(check),
                MAX_EXCESS,
                LOST_TTL_MS,
                *log_bounds,
            ]
            async with asyncio.timeout(ctx.timeout_s):
                reply = await self._scripts.run(PUBLISH, keys, *args, *fields)
            reraise_swallowed_cancel()
            report = parse_reply(reply)
            if report.dropped or report.lost:
                self._trims.report(topic, report)
            return report.entry_id

        return xadd

    # Redis did not answer (in time), or answered "not now" (a failover): worth another
    # try; any other error reply is final.
    is_retryable = staticmethod(is_transient)

    def errors(self, operation: str) -> AbstractContextManager[None]:
        """The one redis-py mapping (router.redis.errors), into BusUnavailable."""
        return redis_errors(BusUnavailable)

    async def prepare(self, topics: Sequence[str], subscriber: str) -> None:
        """Create the subscriber's groups now, so everything published from here on reaches it."""
        keys = [stream_key(self._prefix, t) for t in validate_subscription(topics, subscriber)]
        with redis_errors(BusUnavailable):
            self.check_open()
            await self._create_groups(keys, subscriber, self._consumer or subscriber)

    async def leave(self, topics: Sequence[str], subscriber: str) -> None:
        """Destroy the subscriber's groups: a gateway that stopped cleanly holds no entry
        back from the trim, and what is trimmed unread is not counted lost for it (its
        clients went elsewhere). A gateway that crashed keeps them until
        IMROUTE_BUS_GROUP_IDLE_S, so that its restart re-reads what it had pending."""
        keys = [stream_key(self._prefix, t) for t in validate_subscription(topics, subscriber)]
        with redis_errors(BusUnavailable):
            self.check_open()
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                pipe.xgroup_destroy(key, subscriber)
            for result in await pipe.execute(raise_on_error=False):
                # A stream that is gone (Redis lost its data) took its groups with it.
                if isinstance(result, Exception) and "requires the key" not in str(result):
                    raise result

    async def close(self) -> None:
        """End every subscription and close the client."""
        if not self._begin_close():
            return
        with redis_errors(BusUnavailable):
            await self._redis.aclose()

    async def _consume(
        self, topics: tuple[str, ...], subscriber: str
    ) -> AsyncGenerator[Received, None]:
        reader = _Reader(self, topics, subscriber, self._consumer or subscriber)
        failures = 0
        while not self._closed:
            try:
                batch = await self._until_closed(reader.next_batch())
            except redis.exceptions.RedisError as exc:
                # Every Redis error is retried, not only lost connections: READONLY (a
                # failover) and NOGROUP (Redis lost its data) are error replies that pass.
                failures += 1
                delay = backoff_s(failures, BACKOFF_MIN_S, BACKOFF_MAX_S)
                log.warning("bus subscriber %s: %s; retrying in %.2fs", subscriber, exc, delay)
                reader.restart()
                await self._until_closed(asyncio.sleep(delay))
                continue
            if batch is None:
                return
            failures = 0
            for item in batch:
                yield item

    async def _create_groups(self, keys: Sequence[str], group: str, consumer: str) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.xgroup_create(key, group, id="$", mkstream=True)
            # The consumer now, not at its first read: the trim tells a live group from
            # a departed gateway's by its consumers' idle time.
            pipe.xgroup_createconsumer(key, group, consumer)
        for result in await pipe.execute(raise_on_error=False):
            # BUSYGROUP: the group exists, and keeps its place in the stream.
            if isinstance(result, Exception) and not str(result).startswith("BUSYGROUP"):
                raise result

    async def _ack(self, key: str, group: str, entry_id: bytes) -> None:
        with redis_errors(BusUnavailable):
            self.check_open()
            await self._redis.xack(key, group, entry_id)


# A reader that gets nothing says it is alive at least this often (`_Reader._seen`).
SEEN_EVERY_MAX_S = 60.0
# Past every entry ID: a read of the consumer's own pending entries from here has none.
_PAST_EVERY_ID = "18446744073709551615-18446744073709551614"


class _Reader:
    """Where one subscription stands: its own pending entries first, then new ones."""

    def __init__(
        self, bus: RedisStreamsTransport, topics: Sequence[str], group: str, consumer: str
    ) -> None:
        self._bus = bus
        self._redis = bus._redis
        self._topics = {stream_key(bus._prefix, t): t for t in topics}
        self._group = group
        self._consumer = consumer
        self._ready = False
        self._pending: dict[str, bytes] = {}
        self._claim_from = dict.fromkeys(self._topics, _NO_CURSOR)
        self._next_claim = 0.0
        self._next_seen = 0.0
        # How often a reader that gets nothing says it is alive: well within the idle
        # time after which the trim takes its groups for a departed gateway's.
        self._seen_every_s = min(SEEN_EVERY_MAX_S, bus._group_idle_ms / 1000 / 10)

    def restart(self) -> None:
        """Start over after an error: re-create the groups, re-read the pending entries."""
        # The groups may be gone (Redis lost its data), and a reply lost with its
        # connection left entries pending that this reader never handed out.
        self._ready = False

    async def next_batch(self) -> list[Received]:
        """The next entries to hand out; empty when a blocking read timed out."""
        if not self._ready:
            await self._bus._create_groups(list(self._topics), self._group, self._consumer)
            self._pending = dict.fromkeys(self._topics, b"0")
            self._ready = True
        if self._pending:
            return await self._read_pending()
        now = asyncio.get_running_loop().time()
        if now >= self._next_claim:
            claimed, more = await self._claim()
            # Page on at once while XAUTOCLAIM has more; else sweep twice per min-idle.
            self._next_claim = now if more else now + self._bus._claim_idle_ms / 2000
            if claimed:
                return claimed
        if now >= self._next_seen:
            await self._seen()
            self._next_seen = now + self._seen_every_s
        reply = await self._redis.xreadgroup(
            self._group,
            self._consumer,
            dict.fromkeys(self._topics, ">"),
            count=self._bus._count,
            block=self._bus._block_ms,
        )
        if asyncio.get_running_loop().time() - now > self._bus._stalled_s:
            # This process stalled (SIGSTOP, a frozen VM) while the reply waited: what it
            # was handed may have been trimmed and counted lost meanwhile. Re-read it
            # from the pending list, which says what is still there.
            self._pending = dict.fromkeys(self._topics, b"0")
            return []
        batch: list[Received] = []
        for key, entries in _streams(reply):
            batch += await self._received(key, entries)
        return batch

    async def _seen(self) -> None:
        """Refresh this consumer's idle time on each topic. Before Redis 7.2 a blocking
        read that gets nothing leaves it as it was (and does not even create the
        consumer), so a live gateway on a quiet topic read as idle, and the trim deleted
        its groups as a departed gateway's after IMROUTE_BUS_GROUP_IDLE_S (the Redis
        Cluster operator's trial: a group topic without a multicast for 10 minutes).
        A read of its own pending entries past the highest ID there can be is answered
        at once, with nothing, and refreshes it on every version, leaving the pending
        entries' delivery times (which XAUTOCLAIM goes by) as they are."""
        await self._redis.xreadgroup(
            self._group, self._consumer, dict.fromkeys(self._topics, _PAST_EVERY_ID), count=1
        )

    async def _read_pending(self) -> list[Received]:
        # A fresh dict typed as redis-py declares it (dict is invariant in its types).
        streams: dict[KeyT, StreamIdT] = {key: start for key, start in self._pending.items()}
        reply = await self._redis.xreadgroup(
            self._group, self._consumer, streams, count=self._bus._count
        )
        batch: list[Received] = []
        done = set(self._pending)
        for key, entries in _streams(reply):
            if entries:
                self._pending[key] = entries[-1][0]
                done.discard(key)
                batch += await self._received(key, entries)
        for key in done:
            del self._pending[key]
        return batch

    async def _claim(self) -> tuple[list[Received], bool]:
        batch: list[Received] = []
        more = False
        for key, start in self._claim_from.items():
            cursor, entries, *_ = await self._redis.xautoclaim(
                key,
                self._group,
                self._consumer,
                self._bus._claim_idle_ms,
                start,
                count=self._bus._count,
            )
            self._claim_from[key] = cursor
            more = more or cursor != _NO_CURSOR
            batch += await self._received(key, entries)
        return batch, more

    async def _received(self, key: str, entries: Sequence[Any]) -> list[Received]:
        batch: list[Received] = []
        gone: list[bytes] = []
        for entry_id, fields in entries:
            if entry_id is None:
                continue  # Redis 6.2's XAUTOCLAIM reports a deleted entry as nil
            data = fields.get(_DATA) if fields else None
            if data is None:
                # Trimmed past IMROUTE_BUS_MAXLEN while it was pending: nothing left to
                # deliver (this gateway had it once, and did not ack it in time).
                gone.append(entry_id)
                continue
            batch.append(
                Received(
                    topic=self._topics[key],
                    data=data,
                    attributes={
                        _text(k.removeprefix(_ATTR)): _text(v)
                        for k, v in fields.items()
                        if k.startswith(_ATTR)
                    },
                    message_id=_text(entry_id),
                    acker=functools.partial(self._bus._ack, key, self._group, entry_id),
                )
            )
        if gone:
            log.warning("bus subscriber %s lost %d entries of %s", self._group, len(gone), key)
            await self._redis.xack(key, self._group, *gone)
        return batch


def _streams(reply: Any) -> Iterator[tuple[str, Sequence[Any]]]:
    """(stream key, entries) from an XREADGROUP reply in either of redis-py's shapes."""
    pairs = reply.items() if isinstance(reply, dict) else (reply or ())
    for key, entries in pairs:
        yield _text(key), entries or ()


class RedisStreamsBus(HedgedBus[RedisStreamsTransport]):
    """Redis Streams behind the hedging wrapper: what open_bus gives for redis:// URLs."""

    def __init__(
        self, url: str, prefix: str = "imroute:", **options: Unpack[RedisStreamsBusOptions]
    ) -> None:
        publishing, transport = split_publishing(options)
        super().__init__(RedisStreamsTransport(url, prefix, **transport), **publishing)
