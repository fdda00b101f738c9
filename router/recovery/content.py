"""A broadcast or multicast push's content, stored once for all of its batches.

A push to a million users is a thousand batches; each used to carry the content (up
to 64 KiB), in its bus message and in its topic log entry. Now content over
IMROUTE_BUS_CONTENT_INLINE_MAX bytes is written once, to `content:{msg_id}`, before
the push's first batch, and its batches carry `content_stored` instead: a broadcast
costs the bus and the logs its content once, plus its uids.

The key's TTL (IMROUTE_BUS_CONTENT_TTL_S) is pushed forward while the push publishes,
so it outlives the push's last batch by at least the time anything may still read it:
a gateway that lags or restarts and re-reads the bus (Redis Streams: a group idle up
to IMROUTE_BUS_GROUP_IDLE_S; Pub/Sub: an hour of retention), a resume within the
recovery window. Gateways read a push's content once and keep the last few in memory.
A batch whose content is gone (past the TTL, or a Redis that lost its data) is not
delivered empty: readers treat it as lost, which is counted and logged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from shared.clock import Clock
from shared.keys import KeySchema
from shared.proto import gateway_pb2

__all__ = ["CACHE_ITEMS", "ContentCache", "RedisContentStore"]

# Contents a gateway keeps: pushes in flight at once are few, and each is 64 KiB at most.
CACHE_ITEMS = 256


class RedisContentStore:
    """`content:{msg_id}` keys: written by the push service, read by the gateways."""

    def __init__(
        self, redis: RedisClient, keys: KeySchema, clock: Clock, ttl_s: float, inline_max: int
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self._ttl_ms = int(ttl_s * 1000)
        self._inline_max = inline_max
        # msg_id -> when its TTL was last pushed forward, for the pushes publishing here.
        self._held: OrderedDict[str, int] = OrderedDict()

    def stores(self, content: bytes) -> bool:
        """Whether this content is stored once rather than carried by every batch."""
        return len(content) > self._inline_max

    @translate_errors
    async def hold(self, msg_id: str, content: bytes) -> None:
        """Store the content (first call) or keep it for a full TTL more (now and then)."""
        now = self._clock.now_ms()
        last = self._held.get(msg_id)
        key = self._keys.content(msg_id)
        if last is None:
            await self._redis.set(key, content, px=self._ttl_ms)
        elif now - last >= self._ttl_ms // 10:
            if not await self._redis.pexpire(key, self._ttl_ms):
                # Redis lost it (a restart without persistence): the batches still
                # to come, and the ones before that a gateway has yet to read, need it.
                await self._redis.set(key, content, px=self._ttl_ms)
        else:
            return
        self._held[msg_id] = now
        self._held.move_to_end(msg_id)
        while self._held and now - next(iter(self._held.values())) > self._ttl_ms:
            self._held.popitem(last=False)  # pushes that stopped publishing long ago

    async def get_many(self, msg_ids: Sequence[str]) -> list[bytes | None]:
        """The contents, None where a key is gone; one pipelined round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for msg_id in msg_ids:
            pipe.get(self._keys.content(msg_id))
        return [_bytes(value) for value in await pipe.execute()]


class ContentCache:
    """Puts stored content back into batches; the last CACHE_ITEMS contents in memory."""

    def __init__(self, store: RedisContentStore, items: int = CACHE_ITEMS) -> None:
        self._store = store
        self._items = items
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self.missing = 0  # batches whose content was gone

    async def fill(self, batches: Sequence[gateway_pb2.Batch]) -> list[bool]:
        """Give each batch with `content_stored` its content, in place; per batch,
        whether it now has it (False: gone, the batch must not be delivered)."""
        # This call's contents, apart from the cache: the cache keeps only the last
        # CACHE_ITEMS, and one call (a resume's 1000 batches a topic) or another call
        # during the read may push out what this one fetched before it is used.
        found: dict[str, bytes] = {}
        wanted = set()
        for b in batches:
            msg_id = b.message.msg_id
            if b.message.content_stored:
                content = self._cache.get(msg_id)
                if content is None:
                    wanted.add(msg_id)
                else:
                    found[msg_id] = content
        if wanted:
            ids = sorted(wanted)
            for msg_id, content in zip(ids, await self._store.get_many(ids), strict=True):
                if content is not None:
                    found[msg_id] = content
        filled = []
        for batch in batches:
            message = batch.message
            if not message.content_stored:
                filled.append(True)
                continue
            content = found.get(message.msg_id)
            if content is None:
                self.missing += 1
                filled.append(False)
                continue
            message.content_json = content
            filled.append(True)
        for msg_id, content in found.items():  # the most recently used, at the end
            self._cache[msg_id] = content
            self._cache.move_to_end(msg_id)
        while len(self._cache) > self._items:
            self._cache.popitem(last=False)
        return filled


def _bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value
