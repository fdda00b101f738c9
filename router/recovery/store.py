"""The recovery store in Redis: per-user P2P logs (each user's inbox is the log after
the position the user's devices acked), per-topic batch logs.

Key layout: `shared.keys`. Every write is one Lua script on keys that share a hash
tag, so it works on Redis Cluster; a push to many users pipelines one call per user.
Each log is trimmed by count on every append (LTRIM) and by time from its head (a few
old entries per append; a user's log on every 8th append, its readers filtering by time
themselves). A topic log expires as a whole one window after its last
append; a user's log keeps what is in the inbox past the window and expires one inbox
TTL after its last append, or one window after everything was acked (`ack.lua`).

How an entry is stored: compact JSON text (the client holds decoded strings). A P2P
entry is one message for one user; a topic entry is a whole bus batch (its recipients
and its message), so broadcast and multicast cost one entry per batch. A batch whose
content is stored once per push (`router.recovery.content`) keeps `null` where the
content would be: the log holds each push's content no more than the bus.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from typing import Any

import orjson

from router.recovery.base import (
    OFFLINE_TOPIC,
    Entry,
    LoggedBatch,
    RecoveryLimits,
    TopicHistory,
    TopicSpan,
    UserHistory,
)
from router.recovery.content import ContentCache, RedisContentStore
from router.recovery.lua import ACK, APPEND, APPEND_USER, HEAD, READ_STREAM, READ_TOPIC, READ_USER
from router.redis.autopipe import AutoPipeline
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import ScriptRunner
from shared.clock import Clock
from shared.keys import KeySchema
from shared.models import Message
from shared.positions import counter_of, epoch_of, seq_of
from shared.proto import gateway_pb2

__all__ = [
    "RedisRecoveryStore",
    "decode_batch",
    "decode_message",
    "encode_batch",
    "encode_message",
]


class RedisRecoveryStore:
    """Both halves of the seam: the router's `RecoveryLog`, the gateway's `RecoveryReads`."""

    def __init__(
        self,
        redis: RedisClient,
        keys: KeySchema,
        clock: Clock,
        limits: RecoveryLimits,
        auto: AutoPipeline | None = None,
        *,
        topics_on_bus: bool = False,
    ) -> None:
        """`auto`: calls share its round trips (standalone Redis only). `topics_on_bus`:
        the bus's topics are logged in their streams (the Redis Streams bus on this
        Redis, `router.bus.redis_streams.TopicLog`), which the reads read; the list is
        read too for one release, while one logged apart lasts."""
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self.limits = limits
        # Loaded again, all of them, by the runner when Redis lost its script cache.
        self._scripts = ScriptRunner(
            redis,
            (APPEND, APPEND_USER, READ_USER, ACK, READ_TOPIC, READ_STREAM, HEAD),
            auto,
        )
        # Read once: every append passes them (its window and the limits after it).
        self._window_ms = limits.window_ms
        self._append_limits = (
            limits.user_max,
            limits.window_ms,
            limits.user_seq_ttl_ms,
            limits.inbox_max,
            limits.inbox_ttl_ms,
            "1" if limits.legacy_writes else "0",
        )
        self.content = RedisContentStore(
            redis, keys, clock, limits.content_ttl_s, limits.content_inline_max
        )
        self._contents = ContentCache(self.content)
        self._topics_on_bus = topics_on_bus

    async def _pipelined(self, calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        return await self._scripts.many(calls)

    async def _one(self, args: tuple[Any, ...]) -> Any:
        return await self._scripts.one(args)

    # ------------------------------------------------------------------ RecoveryLog

    async def append_queued(
        self, message: Message, uids: Sequence[str], expires_ms: int
    ) -> tuple[list[int], int]:
        [answer] = await self.append_queued_many([(message, uids, expires_ms)])
        return answer

    def append_queued_many(
        self, items: Sequence[tuple[Message, Sequence[str], int]]
    ) -> Awaitable[list[tuple[list[int], int]]]:
        """Sent now (`ScriptRunner.soon`): the P2P path's look-up of the same loop turn
        shares the round trip, and no task runs the append beside it."""
        now = self._clock.now_ms()
        calls = [c for m, uids, exp in items for c in self._queued_calls(m, uids, exp, now)]
        return self._appended(items, self._scripts.soon(calls) if calls else None)

    @translate_errors
    async def _appended(
        self,
        items: Sequence[tuple[Message, Sequence[str], int]],
        sent: Awaitable[list[Any]] | None,
    ) -> list[tuple[list[int], int]]:
        replies = iter(await sent if sent is not None else ())
        answers: list[tuple[list[int], int]] = []
        for _, uids, _ in items:
            mine = [next(replies) for _ in uids]
            answers.append(([_seq(r) for r in mine], sum(int(r[2]) for r in mine)))
        return answers

    def _queued_calls(
        self, message: Message, uids: Sequence[str], expires_ms: int, now: int
    ) -> list[tuple[Any, ...]]:
        k = self._keys
        tail = (
            encode_message(message, expires_ms),
            now,
            now - self._window_ms,
            *self._append_limits,
        )
        return [APPEND_USER.args(k.user_keys(u), *tail) for u in uids]

    @translate_errors
    async def append_batch(self, topic: str, batch: gateway_pb2.Batch) -> int:
        now = self._clock.now_ms()
        lim = self.limits
        keys = (self._keys.topic_seq(topic), self._keys.topic_log(topic))
        # The topic's sequence never expires: gateways follow it for as long as they run.
        args = APPEND.args(
            keys, encode_batch(batch), now, now - lim.window_ms, lim.topic_max, lim.window_ms, 0
        )
        return _seq(await self._one(args))

    # ------------------------------------------------------------------ RecoveryReads

    async def read_user(self, uid: str, after: int | None) -> UserHistory:
        return (await self.read_users([(uid, after)]))[0]

    @translate_errors
    async def read_users(self, wanted: Sequence[tuple[str, int | None]]) -> list[UserHistory]:
        """`read_user` for many users, in one pipelined round trip."""
        k = self._keys
        lim = self.limits
        calls = [
            READ_USER.args(
                k.user_keys(uid),
                *(("", "") if after is None else (epoch_of(after), counter_of(after))),
                lim.user_max,
            )
            for uid, after in wanted
        ]
        replies = [await self._one(calls[0])] if len(calls) == 1 else await self._pipelined(calls)
        cutoff = self._clock.now_ms() - lim.window_ms
        return [
            _user_history(reply, after, cutoff, lim)
            for reply, (_, after) in zip(replies, wanted, strict=True)
        ]

    @translate_errors
    async def ack(self, wanted: Sequence[tuple[str, int]]) -> list[None]:
        """Move each (uid, seq) user's acked position up to seq, in one pipelined round
        trip: what a device acked leaves the user's inbox (the log after it)."""
        k = self._keys
        window = self.limits.window_ms
        calls = [
            ACK.args(
                k.user_keys(uid),
                epoch_of(seq),
                counter_of(seq),
                window,
            )
            for uid, seq in wanted
        ]
        if calls:
            await self._pipelined(calls)
        return [None] * len(wanted)

    @translate_errors
    async def read_topic(self, topic: str, after: int, upto: int | None = None) -> TopicHistory:
        head, entries, _, _ = await self._read(topic, after, upto, 0, 0)
        decoded = [batch for batch, _ in entries]
        filled = await self._contents.fill(decoded)
        # A batch whose content is gone is left out: a hole, which readers count as lost.
        batches = [LoggedBatch(b) for b, ok in zip(decoded, filled, strict=True) if ok]
        return TopicHistory(head, batches)

    @translate_errors
    async def read_span(
        self, topic: str, after: int, upto: int | None, max_entries: int, max_bytes: int
    ) -> TopicSpan:
        head, entries, over, over_at = await self._read(topic, after, upto, max_bytes, max_entries)
        batches = [LoggedBatch(batch) for batch, _ in entries]
        return TopicSpan(head, batches, [size for _, size in entries], over, over_at)

    async def _read(
        self, topic: str, after: int, upto: int | None, max_bytes: int, max_entries: int
    ) -> tuple[int, list[tuple[gateway_pb2.Batch, int]], bool, int]:
        """One read of a topic's log: its head, the batches after `after` through `upto`
        within the budget with the bytes each took there (as Lua counts them), whether
        it was over the budget and the seq from which the batches are all there."""
        k = self._keys
        bound = ("", "") if upto is None else (epoch_of(upto), counter_of(upto))
        args = (epoch_of(after), counter_of(after), *bound, max_bytes, max_entries)
        seq_key = k.topic_seq(topic)
        entries: list[tuple[gateway_pb2.Batch, int]] = []
        if self._topics_on_bus and topic != OFFLINE_TOPIC:
            on_bus = (seq_key, k.bus_stream(topic), k.topic_log(topic))
            head, epoch, flat, over, start = await self._scripts.raw(
                READ_STREAM.args(on_bus, *args)
            )
            e = int(epoch)
            for i in range(0, len(flat), 3):
                n, kind, value = int(flat[i]), int(flat[i + 1]), flat[i + 2]
                entries.append((_stream_entry(n, e, value, kind), _size(value)))
        else:
            keys = (seq_key, k.topic_log(topic))
            head, epoch, log, over, start = await self._one(READ_TOPIC.args(keys, *args))
            e = int(epoch)
            for text in log:
                seq, _, data = _split(text)
                entries.append((decode_batch(seq, data, e), _size(text)))
        over_at = seq_of(e, int(start)) if int(over) else 0
        return _head(head, e), entries, bool(int(over)), over_at

    @translate_errors
    async def fill_content(self, batches: Sequence[gateway_pb2.Batch]) -> list[bool]:
        return await self._contents.fill(batches)

    @property
    def content_missing(self) -> int:
        """Batches (from the bus or a topic log) whose stored content was gone."""
        return self._contents.missing

    @translate_errors
    async def heads(self, topics: Sequence[str]) -> list[int]:
        calls = [HEAD.args((self._keys.topic_seq(t),)) for t in topics]
        return [_head(n, int(e)) for n, e in await self._pipelined(calls)]


def _size(value: str | bytes) -> int:
    """An entry's bytes, as Lua counts them."""
    if isinstance(value, bytes):
        return len(value)
    return len(value) if value.isascii() else len(value.encode())


def _stream_entry(n: int, epoch: int, value: bytes, kind: int) -> gateway_pb2.Batch:
    """A read_stream.lua entry: a stream entry's batch (kind 0), or a list entry (1)."""
    if kind:
        return decode_batch(n, _split(value.decode())[2], epoch)
    batch = gateway_pb2.Batch.FromString(value)
    batch.seq, batch.epoch = n, epoch
    return batch


def _seq(reply: Sequence[Any]) -> int:
    """The seq an append answered ({n, epoch, ...})."""
    return seq_of(int(reply[1]), int(reply[0]))


def _head(n: Any, epoch: int) -> int:
    """A log's head seq; 0 when it has no entry (a log that is gone included)."""
    n = int(n)
    return seq_of(epoch, n) if n else 0


def _user_history(
    reply: Sequence[Any], after: int | None, cutoff: int, limits: RecoveryLimits
) -> UserHistory:
    """The log part (the entries after `after` among the last `user_max`, inside the
    window; none when `after` is None) and the inbox (the entries after `start`: the
    acked position, or the last entry the inbox bound pushed out; and what a legacy
    inbox still holds of them, up to `whole` and past `start`)."""
    n, epoch_text, start_text, texts, legacy, whole_text = reply
    head, epoch, start, whole = int(n), int(epoch_text), int(start_text), int(whole_text)
    entries = []
    for text in texts:
        c, ts, data = _split(text)
        _, message, expires_ms = decode_message(data)
        entries.append((c, ts, Entry(seq_of(epoch, c), message, expires_ms)))
    log: list[Entry] = []
    if after is not None:
        first = counter_of(after) if epoch_of(after) == epoch else 0
        first = max(first, head - limits.user_max)
        log = [e for c, ts, e in entries if c > first and ts >= cutoff]
    inbox = [e for c, _, e in entries if c > start]
    if legacy:
        held = {e.seq for e in inbox}
        for text in legacy:
            c = int(text[1 : text.index(",")])
            seq = seq_of(epoch, c)
            # Past `whole`, a push service of the version before wrote it: the acked
            # position covers it, or it is the inbox's (read_user.lua).
            if seq not in held and (c <= whole or c > start):
                _, message, expires_ms = decode_message(text)
                inbox.append(Entry(seq, message, expires_ms))
        inbox.sort(key=lambda e: e.seq)
    return UserHistory(_head(head, epoch), log, inbox)


def _split(text: str) -> tuple[int, int, str]:
    """(n, ts, data) of a log element."""
    n, ts, data = text.split(" ", 2)
    return int(n), int(ts), data


# ------------------------------------------------------------ an entry's text (its format)

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _fields(message: Message, expires_ms: int) -> list[Any]:
    return [
        message.msg_id,
        message.push_id,
        message.msg_type,
        message.sender,
        message.content_json.decode(),
        message.ts_ms,
        expires_ms,
    ]


def encode_message(message: Message, expires_ms: int, seq: int = 0) -> str:
    """A P2P entry; `seq` is kept in the text where the store needs it (the inbox)."""
    fields = [seq, *_fields(message, expires_ms)]
    try:
        return orjson.dumps(fields).decode()  # the same JSON text, about 5 times faster
    except TypeError:  # what orjson refuses (a lone surrogate) json may take
        return _dumps(fields)


def decode_message(text: str) -> tuple[int, Message, int]:
    """(seq, message, expires_ms) of a P2P entry; ValueError if it is not one."""
    seq, msg_id, push_id, msg_type, sender, content, ts_ms, expires_ms = json.loads(text)
    message = Message(msg_id, push_id, int(msg_type), sender, content.encode(), int(ts_ms))
    return int(seq), message, int(expires_ms)


def encode_batch(batch: gateway_pb2.Batch) -> str:
    """A topic entry: the batch without its seq (the log's entry id is the seq)."""
    m = batch.message
    message = Message(m.msg_id, m.push_id, m.msg_type, getattr(m, "from"), m.content_json, m.ts_ms)
    fields = _fields(message, batch.expires_ms)
    if m.content_stored:
        fields[4] = None
    extra = [int(batch.mode), batch.group_id, batch.everyone, list(batch.uids), batch.batch_id]
    return _dumps([*fields, *extra])


def decode_batch(seq: int, text: str, epoch: int = 0) -> gateway_pb2.Batch:
    """The batch a topic entry holds, with its seq (the log's counter) and its log's
    epoch; ValueError if it is not one."""
    fields: Sequence[Any] = json.loads(text)
    msg_id, push_id, msg_type, sender, content, ts_ms, expires_ms = fields[:7]
    mode, group_id, everyone, uids, batch_id = fields[7:]
    return gateway_pb2.Batch(
        batch_id=batch_id,
        message=gateway_pb2.Message(
            msg_id=msg_id,
            push_id=push_id,
            msg_type=int(msg_type),
            content_json=b"" if content is None else content.encode(),
            ts_ms=int(ts_ms),
            content_stored=content is None,
            **{"from": sender},
        ),
        uids=uids,
        mode=mode,
        everyone=bool(everyone),
        group_id=group_id,
        expires_ms=int(expires_ms),
        seq=seq,
        epoch=epoch,
    )
