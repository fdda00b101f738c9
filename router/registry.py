"""Userinfo in Redis: where each live connection of a user lives.

The gateway registers, refreshes and unregisters its connections; the router
looks users up in pipelined chunks of at most 1000. Key layout: `shared.keys`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from redis.exceptions import NoScriptError

from router.redis_client import RedisClient, translate_errors
from shared.clock import Clock
from shared.keys import KeySchema, decode_route, encode_route
from shared.models import Route

__all__ = ["LOOKUP_CHUNK", "RedisRouteRegistry", "Registration", "RouteRegistry"]

LOOKUP_CHUNK = 1000

T = TypeVar("T")

# Sets one connection's field, drops fields whose own deadline has passed, and
# extends the key's PEXPIRE without ever shortening it. Heartbeats upsert too, so
# routes come back by themselves after Redis lost its data (restart, failover).
_UPSERT = """
local key, field, value = KEYS[1], ARGV[1], ARGV[2]
local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('HSET', key, field, value)
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local exp = tonumber(string.match(all[i + 1], '|(%d+)$'))
  if exp and exp <= now then redis.call('HDEL', key, all[i]) end
end
if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
return 1
"""


@dataclass(frozen=True, slots=True)
class Registration:
    """One local connection as the gateway registers it."""

    uid: str
    conn_id: str


@dataclass(frozen=True, slots=True)
class RouteOp:
    """One write: register (True) or unregister (False) a connection."""

    register: bool
    uid: str
    conn_id: str


class RouteRegistry(Protocol):
    async def register(self, uid: str, conn_id: str) -> None: ...
    async def unregister(self, uid: str, conn_id: str) -> None: ...
    async def unregister_many(self, registrations: Iterable[Registration]) -> None: ...
    async def apply(self, ops: Sequence[RouteOp]) -> None: ...
    async def refresh(self, registrations: Iterable[Registration]) -> int: ...
    async def lookup(self, uids: Sequence[str]) -> dict[str, list[Route]]: ...
    async def remove(self, routes: Iterable[Route]) -> None: ...


class RedisRouteRegistry:
    """Routes of one gateway (for writes) or of all (for lookups) in Redis."""

    def __init__(
        self,
        redis: RedisClient,
        keys: KeySchema,
        clock: Clock,
        *,
        ttl_s: float = 60.0,
        gateway_id: str = "",
        group_id: str = "",
        ip: str = "",
        port: int = 0,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self._ttl_ms = int(ttl_s * 1000)
        self._where = (gateway_id, group_id, ip, port)
        self._upsert_sha = hashlib.sha1(_UPSERT.encode()).hexdigest()

    def _value(self, now_ms: int) -> str:
        gateway_id, group_id, ip, port = self._where
        return encode_route(gateway_id, group_id, ip, port, now_ms + self._ttl_ms)

    async def register(self, uid: str, conn_id: str) -> None:
        """Record a new connection of `uid` on this gateway."""
        await self.apply([RouteOp(True, uid, conn_id)])

    async def unregister(self, uid: str, conn_id: str) -> None:
        """Remove exactly this connection; other connections of the user stay."""
        await self.apply([RouteOp(False, uid, conn_id)])

    async def unregister_many(self, registrations: Iterable[Registration]) -> None:
        """Remove many connections (a gateway shutting down), 1000 per round trip."""
        for chunk in chunks(RouteOp(False, r.uid, r.conn_id) for r in registrations):
            await self.apply(chunk)

    async def refresh(self, registrations: Iterable[Registration]) -> int:
        """Upsert the routes of live connections with a new deadline; returns how many."""
        count = 0
        for chunk in chunks(RouteOp(True, r.uid, r.conn_id) for r in registrations):
            await self.apply(chunk)
            count += len(chunk)
        return count

    @translate_errors
    async def apply(self, ops: Sequence[RouteOp]) -> None:
        """Apply registers and unregisters in order, in one pipelined round trip."""
        if not ops:
            return
        try:
            await self._apply(ops)
        except NoScriptError:
            # Redis restarted (or failed over) and lost its script cache: load and redo;
            # every operation is idempotent.
            await self._redis.script_load(_UPSERT)
            await self._apply(ops)

    async def _apply(self, ops: Sequence[RouteOp]) -> None:
        # EVALSHA directly: redis-py's Script objects add a SCRIPT EXISTS round trip to
        # every pipeline that carries them.
        now = self._clock.now_ms()
        value = self._value(now)
        pipe = self._redis.pipeline(transaction=False)
        for op in ops:
            key = self._keys.route(op.uid)
            if op.register:
                pipe.evalsha(self._upsert_sha, 1, key, op.conn_id, value, now, self._ttl_ms)
            else:
                pipe.hdel(key, op.conn_id)
        await pipe.execute()

    @translate_errors
    async def lookup(self, uids: Sequence[str]) -> dict[str, list[Route]]:
        """Live routes of each uid (absent when offline): one round trip per 1000 uids."""
        found: dict[str, list[Route]] = {}
        for start in range(0, len(uids), LOOKUP_CHUNK):
            chunk = uids[start : start + LOOKUP_CHUNK]
            pipe = self._redis.pipeline(transaction=False)
            for uid in chunk:
                pipe.hgetall(self._keys.route(uid))
            results: list[Mapping[str, str]] = await pipe.execute()
            now = self._clock.now_ms()
            for uid, fields in zip(chunk, results, strict=True):
                routes = [
                    route
                    for conn_id, value in fields.items()
                    if (route := decode_route(uid, conn_id, value)) and route.expires_ms > now
                ]
                if routes:
                    found[uid] = routes
        return found

    async def remove(self, routes: Iterable[Route]) -> None:
        """Delete these exact routes (by connection id), 1000 per round trip."""
        await self.unregister_many(Registration(r.uid, r.conn_id) for r in routes)


def chunks(items: Iterable[T], size: int = LOOKUP_CHUNK) -> Iterator[list[T]]:
    """`items` as lists of at most `size`."""
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
