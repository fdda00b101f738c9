"""The recovery store in Redis: per-user P2P logs and inboxes, per-topic batch logs.

Key layout: `shared.keys`. Every write is one Lua script on keys that share a hash
tag, so it works on Redis Cluster; a push to many users pipelines one call per user.
Each log is trimmed by count on every append (LTRIM), by time from its head (a few
old entries per append), and expires as a whole one window after its last append.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from router.recovery.base import (
    Entry,
    LoggedBatch,
    RecoveryLimits,
    TopicHistory,
    UserHistory,
)
from router.recovery.codec import decode_batch, decode_message, encode_batch, encode_message
from router.recovery.content import ContentCache, RedisContentStore
from router.redis.autopipe import AutoPipeline
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import Script, ScriptRunner
from shared.clock import Clock
from shared.keys import KeySchema
from shared.models import Message
from shared.proto import gateway_pb2

__all__ = ["RedisRecoveryStore"]


# KEYS: seq, log. ARGV: data, now, cutoff (now - window), maxlen, log ttl, seq ttl (0: none).
# A log is a list of "<seq> <ts> <data>", appended under its sequence in one script, so
# the last element is always the head and seq s sits at index -(head - s + 1). A list
# costs about 180 bytes per entry; a stream would cost 4.7 KB for its first one.
_APPEND = """
local s = redis.call('INCR', KEYS[1])
if tonumber(ARGV[6]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[6]) end
redis.call('RPUSH', KEYS[2], s .. ' ' .. ARGV[2] .. ' ' .. ARGV[1])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
local cutoff = tonumber(ARGV[3])
for _ = 1, 4 do
  local first = redis.call('LINDEX', KEYS[2], 0)
  if not first or tonumber(string.match(first, '^%d+ (%d+) ')) >= cutoff then break end
  redis.call('LPOP', KEYS[2])
end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return s
"""

# KEYS: seq, log, inbox. ARGV: as _APPEND's, then the inbox's max and ttl. _APPEND, and
# the entry (its text starts "[0," for seq 0: the inbox's copy carries its seq) into the
# inbox, where it stays until a device acks it. Returns {seq, entries the inbox dropped}.
_APPEND_QUEUED = (
    "local function append()\n"
    + _APPEND
    + """end
local s = append()
redis.call('ZADD', KEYS[3], s, '[' .. s .. ',' .. string.sub(ARGV[1], 4))
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[7])
if over > 0 then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1) else over = 0 end
redis.call('PEXPIRE', KEYS[3], ARGV[8])
return {s, over}
"""
)

# KEYS: inbox. ARGV: seq, data, max, ttl. Returns how many old entries were dropped.
_QUEUE = """
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[3])
if over > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1) else over = 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return over
"""

# KEYS: seq, log, inbox. ARGV: after ('' for no log). Returns {head, log, inbox}.
_READ_USER = """
local head = tonumber(redis.call('GET', KEYS[1]) or '0')
local log = {}
if ARGV[1] ~= '' and head > tonumber(ARGV[1]) then
  log = redis.call('LRANGE', KEYS[2], tonumber(ARGV[1]) - head, -1)
end
return {head, log, redis.call('ZRANGE', KEYS[3], 0, -1)}
"""

# KEYS: inbox. ARGV: seqs.
_FORGET = """
for i = 1, #ARGV do redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[i], ARGV[i]) end
return #ARGV
"""

# KEYS: seq, log. ARGV: after, upto ('' for the head). Returns {head, entries}.
_READ_TOPIC = """
local head = tonumber(redis.call('GET', KEYS[1]) or '0')
local after = tonumber(ARGV[1])
local upto = ARGV[2] == '' and head or math.min(tonumber(ARGV[2]), head)
if upto <= after then return {head, {}} end
return {head, redis.call('LRANGE', KEYS[2], after - head, upto - head - 1)}
"""


class RedisRecoveryStore:
    """Both halves of the seam: the router's `RecoveryLog`, the gateway's `RecoveryReads`."""

    def __init__(
        self,
        redis: RedisClient,
        keys: KeySchema,
        clock: Clock,
        limits: RecoveryLimits,
        auto: AutoPipeline | None = None,
    ) -> None:
        """`auto`: calls share its round trips (standalone Redis only)."""
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self.limits = limits
        self._append = Script(_APPEND)
        self._queue = Script(_QUEUE)
        self._read_user = Script(_READ_USER)
        self._forget = Script(_FORGET)
        self._read_topic = Script(_READ_TOPIC)
        self._append_queued = Script(_APPEND_QUEUED)
        # Loaded again, all of them, by the runner when Redis lost its script cache.
        self._scripts = ScriptRunner(
            redis,
            (
                self._append,
                self._queue,
                self._read_user,
                self._forget,
                self._read_topic,
                self._append_queued,
            ),
            auto,
        )
        # A sequence outlives what it numbers, so a position never meets a restarted count
        # while the entries it names could still be read.
        self._seq_ttl_ms = max(limits.window_ms, limits.inbox_ttl_ms) + limits.window_ms
        self.content = RedisContentStore(
            redis, keys, clock, limits.content_ttl_s, limits.content_inline_max
        )
        self._contents = ContentCache(self.content)

    async def _pipelined(self, calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        return await self._scripts.many(calls)

    async def _one(self, args: tuple[Any, ...]) -> Any:
        return await self._scripts.one(args)

    # ------------------------------------------------------------------ RecoveryLog

    @translate_errors
    async def append_p2p(self, message: Message, uids: Sequence[str], expires_ms: int) -> list[int]:
        data = encode_message(message, expires_ms)
        now = self._clock.now_ms()
        lim = self.limits
        k = self._keys
        tail = (data, now, now - lim.window_ms, lim.user_max, lim.window_ms, self._seq_ttl_ms)
        calls = [self._append.args((k.user_seq(u), k.user_log(u)), *tail) for u in uids]
        if len(calls) == 1:
            return [int(await self._one(calls[0]))]
        return [int(s) for s in await self._pipelined(calls)]

    @translate_errors
    async def append_queued(
        self, message: Message, uids: Sequence[str], expires_ms: int
    ) -> tuple[list[int], int]:
        calls = self._queued_calls(message, uids, expires_ms, self._clock.now_ms())
        if len(calls) == 1:
            replies = [await self._one(calls[0])]
        else:
            replies = await self._pipelined(calls)
        return [int(r[0]) for r in replies], sum(int(r[1]) for r in replies)

    @translate_errors
    async def append_queued_many(
        self, items: Sequence[tuple[Message, Sequence[str], int]]
    ) -> list[tuple[list[int], int]]:
        now = self._clock.now_ms()
        calls = [c for m, uids, exp in items for c in self._queued_calls(m, uids, exp, now)]
        replies = iter(await self._pipelined(calls) if calls else ())
        answers: list[tuple[list[int], int]] = []
        for _, uids, _ in items:
            mine = [next(replies) for _ in uids]
            answers.append(([int(r[0]) for r in mine], sum(int(r[1]) for r in mine)))
        return answers

    def _queued_calls(
        self, message: Message, uids: Sequence[str], expires_ms: int, now: int
    ) -> list[tuple[Any, ...]]:
        lim = self.limits
        k = self._keys
        tail = (
            encode_message(message, expires_ms),
            now,
            now - lim.window_ms,
            lim.user_max,
            lim.window_ms,
            self._seq_ttl_ms,
            lim.inbox_max,
            lim.inbox_ttl_ms,
        )
        return [
            self._append_queued.args((k.user_seq(u), k.user_log(u), k.user_inbox(u)), *tail)
            for u in uids
        ]

    @translate_errors
    async def queue(self, message: Message, expires_ms: int, seqs: Mapping[str, int]) -> int:
        if not seqs:
            return 0
        lim = self.limits
        calls = [
            self._queue.args(
                (self._keys.user_inbox(uid),),
                seq,
                encode_message(message, expires_ms, seq),
                lim.inbox_max,
                lim.inbox_ttl_ms,
            )
            for uid, seq in seqs.items()
        ]
        return sum(int(n) for n in await self._pipelined(calls))

    @translate_errors
    async def append_batch(self, topic: str, batch: gateway_pb2.Batch) -> int:
        now = self._clock.now_ms()
        lim = self.limits
        keys = (self._keys.topic_seq(topic), self._keys.topic_log(topic))
        # The topic's sequence never expires: gateways follow it for as long as they run.
        args = self._append.args(
            keys, encode_batch(batch), now, now - lim.window_ms, lim.topic_max, lim.window_ms, 0
        )
        return int(await self._one(args))

    # ------------------------------------------------------------------ RecoveryReads

    async def read_user(self, uid: str, after: int | None) -> UserHistory:
        return (await self.read_users([(uid, after)]))[0]

    @translate_errors
    async def read_users(self, wanted: Sequence[tuple[str, int | None]]) -> list[UserHistory]:
        """`read_user` for many users, in one pipelined round trip."""
        k = self._keys
        calls = [
            self._read_user.args(
                (k.user_seq(uid), k.user_log(uid), k.user_inbox(uid)),
                "" if after is None else after,
            )
            for uid, after in wanted
        ]
        replies = [await self._one(calls[0])] if len(calls) == 1 else await self._pipelined(calls)
        return [_user_history(reply) for reply in replies]

    async def forget_inbox(self, uid: str, seqs: Sequence[int]) -> None:
        await self.forget_inboxes([(uid, seqs)])

    @translate_errors
    async def forget_inboxes(self, wanted: Sequence[tuple[str, Sequence[int]]]) -> list[None]:
        """`forget_inbox` for many users, in one pipelined round trip."""
        k = self._keys
        calls = [self._forget.args((k.user_inbox(uid),), *seqs) for uid, seqs in wanted if seqs]
        if calls:
            await self._pipelined(calls)
        return [None] * len(wanted)

    @translate_errors
    async def read_topic(self, topic: str, after: int, upto: int | None = None) -> TopicHistory:
        keys = (self._keys.topic_seq(topic), self._keys.topic_log(topic))
        head, log = await self._one(
            self._read_topic.args(keys, after, "" if upto is None else upto)
        )
        decoded = [decode_batch(seq, data) for seq, _, data in map(_split, log)]
        filled = await self._contents.fill(decoded)
        # A batch whose content is gone is left out: a hole, which readers count as lost.
        batches = [LoggedBatch(b) for b, ok in zip(decoded, filled, strict=True) if ok]
        return TopicHistory(int(head), batches)

    @translate_errors
    async def fill_content(self, batches: Sequence[gateway_pb2.Batch]) -> list[bool]:
        return await self._contents.fill(batches)

    @property
    def content_missing(self) -> int:
        """Batches (from the bus or a topic log) whose stored content was gone."""
        return self._contents.missing

    @translate_errors
    async def heads(self, topics: Sequence[str]) -> list[int]:
        pipe = self._redis.pipeline(transaction=False)
        for topic in topics:
            pipe.get(self._keys.topic_seq(topic))
        return [int(v or 0) for v in await pipe.execute()]


def _user_history(reply: Sequence[Any]) -> UserHistory:
    head, log, inbox = reply
    entries = []
    for text in log:
        seq, _, data = _split(text)
        _, message, expires_ms = decode_message(data)
        entries.append(Entry(seq, message, expires_ms))
    logged = {e.seq: e for e in entries}
    queued = []
    for text in inbox:
        # An inbox entry is usually in the log too (a recent miss): decoded once.
        seen = logged.get(int(text[1 : text.index(",")]))
        queued.append(seen if seen is not None else Entry(*decode_message(text)))
    return UserHistory(int(head), entries, queued)


def _split(text: str) -> tuple[int, int, str]:
    """(seq, ts, data) of a log element."""
    seq, ts, data = text.split(" ", 2)
    return int(seq), int(ts), data
