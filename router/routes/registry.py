"""Userinfo in Redis: where each live connection of a user lives.

The gateway registers, refreshes and unregisters its connections; the router
looks users up in chunks of at most 1000 per round trip (`router.routes.reads` says how:
one packed request on standalone Redis, redis-py's pipeline on Redis Cluster). Key
layout: `shared.keys`. A new connection is admitted only while its user has fewer than
`max_per_user` live routes across the fleet, and no write reads the user's whole hash.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence

from redis.exceptions import NoScriptError

from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.routes.base import (
    LOOKUP_CHUNK,
    ConnectionEvents,
    GroupLookup,
    RecipientGroups,
    RouteOp,
    RouteRegistry,
    chunks,
)
from router.routes.codec import decode_route, encode_route, group_live_routes
from router.routes.reads import HashReads, hash_reads_for
from shared.clock import Clock
from shared.errors import RegistryUnavailable, TooManyConnections
from shared.keys import KeySchema
from shared.models import Registration, Route

__all__ = [
    "LOOKUP_CHUNK",
    "GroupLookup",
    "RecipientGroups",
    "RedisRouteRegistry",
    "Registration",
    "RouteRegistry",
]

log = logging.getLogger(__name__)

# Fields sampled by every write to drop dead ones (a crashed gateway's routes), and by a
# new connection of a user at the cap before it is refused. HRANDFIELD costs O(count)
# whatever the hash's size (at most 3 * count on a large hash, or the whole hash when it
# is smaller than count), so no write ever reads the whole hash of a user with thousands
# of connections; a hash of at most REAP_SAMPLE fields is swept exactly.
SWEEP_SAMPLE = 2
REAP_SAMPLE = 128

# Sets one connection's field and extends the key's PEXPIRE without ever shortening it;
# first drops the fields past their own deadline among a few sampled ones. A new
# connection (cap > 0) is refused (0) when its user already has `cap` fields, counted
# after a sweep of up to REAP_SAMPLE of them, so only live routes count; one script, so
# two gateways admitting the same user at once cannot both pass the check. Heartbeats
# upsert too (cap 0), so routes come back by themselves after Redis lost its data
# (restart, failover). Every call is O(1) in the number of the user's connections.
_UPSERT = f"""
local key, field, value = KEYS[1], ARGV[1], ARGV[2]
local now, ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local function sweep(count)
  local sample = redis.call('HRANDFIELD', key, count, 'WITHVALUES')
  for i = 1, #sample, 2 do
    local exp = tonumber(string.match(sample[i + 1], '|(%d+)$'))
    if exp and exp <= now then redis.call('HDEL', key, sample[i]) end
  end
end
sweep({SWEEP_SAMPLE})
if cap > 0 and redis.call('HEXISTS', key, field) == 0
    and redis.call('HLEN', key) >= cap then
  sweep({REAP_SAMPLE})
  if redis.call('HLEN', key) >= cap then return 0 end
end
redis.call('HSET', key, field, value)
if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
return 1
"""


# Removes one connection's field; returns 1 when the user is left without a live route (a
# presence event is due). Reads the remaining values only when there are few (a user
# with more than 64 fields is taken to have a live one): O(1) like every write.
_REMOVE = """
local key, now = KEYS[1], tonumber(ARGV[2])
redis.call('HDEL', key, ARGV[1])
local n = redis.call('HLEN', key)
if n == 0 then return 1 end
if n > 64 then return 0 end
for _, v in ipairs(redis.call('HVALS', key)) do
  local exp = tonumber(string.match(v, '|(%d+)$'))
  if exp and exp > now then return 0 end
end
return 1
"""


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
        reads: HashReads | None = None,
        max_per_user: int = 0,
        presence: ConnectionEvents | None = None,
    ) -> None:
        """`max_per_user`: live connections a user may have fleet-wide; a `register`
        past it raises TooManyConnections (0: no cap). `presence`: told of new
        connections and of users left without a live route (webhooks on; otherwise
        an unregister stays a plain HDEL)."""
        self._redis = redis
        self.max_per_user = max_per_user
        self.reads = reads or hash_reads_for(redis)
        self._keys = keys
        self._clock = clock
        self._ttl_ms = int(ttl_s * 1000)
        self._where = (gateway_id, group_id, ip, port)
        self._upsert_sha = hashlib.sha1(_UPSERT.encode()).hexdigest()
        self._remove_sha = hashlib.sha1(_REMOVE.encode()).hexdigest()
        self._presence = presence

    def _value(self, now_ms: int) -> str:
        gateway_id, group_id, ip, port = self._where
        return encode_route(gateway_id, group_id, ip, port, now_ms + self._ttl_ms)

    async def register(self, uid: str, conn_id: str) -> None:
        """Record a new connection of `uid` on this gateway; TooManyConnections when
        `uid` is at the cap."""
        (accepted,) = await self.apply([RouteOp(True, uid, conn_id, new=True)])
        if not accepted:
            raise TooManyConnections(uid, self.max_per_user)

    async def unregister(self, uid: str, conn_id: str) -> None:
        """Remove exactly this connection; other connections of the user stay."""
        await self.apply([RouteOp(False, uid, conn_id)])

    async def unregister_many(self, registrations: Iterable[Registration]) -> None:
        """Remove many connections (a gateway shutting down), 1000 per round trip."""
        for chunk in chunks(RouteOp(False, r.uid, r.conn_id) for r in registrations):
            await self.apply(chunk)

    async def refresh(self, registrations: Iterable[Registration]) -> int:
        """Upsert the routes of live connections with a new deadline; returns how many.

        A chunk that fails (a flaky Redis) does not stop the rest: stopping there would
        leave the same users, those past it, unrefreshed round after round until their
        routes lapse while they are connected. Failed chunks are tried once more at the
        end; if any still fail, RegistryUnavailable says how many routes were left (the
        next refresh tries them again)."""
        count = 0
        failed: list[list[RouteOp]] = []
        for chunk in chunks(RouteOp(True, r.uid, r.conn_id) for r in registrations):
            try:
                await self.apply(chunk)
            except RegistryUnavailable:
                failed.append(chunk)
            else:
                count += len(chunk)
        left = 0
        error: RegistryUnavailable | None = None
        for chunk in failed:
            try:
                await self.apply(chunk)
            except RegistryUnavailable as exc:
                left += len(chunk)
                error = exc
            else:
                count += len(chunk)
        if error is not None:
            raise RegistryUnavailable(
                f"{left} of {count + left} routes not refreshed (retried once): {error}"
            )
        return count

    @translate_errors
    async def apply(self, ops: Sequence[RouteOp]) -> list[bool]:
        """Apply registers and unregisters in order, in one pipelined round trip.

        One flag per op: False for a new connection refused by the per-user cap."""
        if not ops:
            return []
        try:
            replies = await self._apply(ops)
        except NoScriptError:
            # Redis restarted (or failed over) and lost its script cache: load and redo;
            # every operation is idempotent.
            await self._redis.script_load(_UPSERT)
            if self._presence is not None:
                await self._redis.script_load(_REMOVE)
            replies = await self._apply(ops)
        accepted = [
            not (op.register and op.new) or reply == 1
            for op, reply in zip(ops, replies, strict=True)
        ]
        if self._presence is not None:
            await self._track(self._presence, ops, replies)
        return accepted

    async def _track(
        self, presence: ConnectionEvents, ops: Sequence[RouteOp], replies: list[object]
    ) -> None:
        connected = [op.uid for op, r in zip(ops, replies, strict=True) if op.new and r == 1]
        emptied = [op.uid for op, r in zip(ops, replies, strict=True) if not op.register and r]
        if not connected and not emptied:
            return
        try:
            await presence.track(connected, emptied)
        except RegistryUnavailable as exc:
            # The routes are written; only presence lags. A missed epoch is caught by the
            # sweeper's live-route check, a missed schedule by the gateway's set.
            log.warning("presence of %d users not tracked: %s", len(connected) + len(emptied), exc)

    async def _apply(self, ops: Sequence[RouteOp]) -> list[object]:
        # EVALSHA directly: redis-py's Script objects add a SCRIPT EXISTS round trip to
        # every pipeline that carries them. Through execute_command, because redis-py's
        # cluster pipeline refuses `evalsha()` but routes "EVALSHA sha 1 key" by its key.
        now = self._clock.now_ms()
        value = self._value(now)
        cap = self.max_per_user
        pipe = self._redis.pipeline(transaction=False)
        for op in ops:
            key = self._keys.route(op.uid)
            if op.register:
                pipe.execute_command(
                    "EVALSHA",
                    self._upsert_sha,
                    1,
                    key,
                    op.conn_id,
                    value,
                    now,
                    self._ttl_ms,
                    cap if op.new else 0,
                )
            elif self._presence is not None:
                pipe.execute_command("EVALSHA", self._remove_sha, 1, key, op.conn_id, now)
            else:
                pipe.hdel(key, op.conn_id)
        replies: list[object] = await pipe.execute()
        return replies

    @translate_errors
    async def lookup(self, uids: Sequence[str]) -> dict[str, list[Route]]:
        """Live routes of each uid (absent when offline): one round trip per 1000 uids."""
        found: dict[str, list[Route]] = {}
        route_key = self._keys.route
        for start in range(0, len(uids), LOOKUP_CHUNK):
            chunk = uids[start : start + LOOKUP_CHUNK]
            results = await self.reads.hgetall([route_key(uid) for uid in chunk])
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

    @translate_errors
    async def lookup_groups(self, uids: Sequence[str]) -> RecipientGroups:
        """Who is online in which group: values only, no `Route` objects, 1000 per round trip."""
        if len(uids) > LOOKUP_CHUNK:
            merged = RecipientGroups()
            for chunk in chunks(uids):
                part = await self.lookup_groups(chunk)
                merged.online += part.online
                for group, members in part.by_group.items():
                    merged.by_group.setdefault(group, []).extend(members)
            return merged
        values = await self.reads.hvals(uids, prefix=self._keys.route(""))
        return RecipientGroups(*group_live_routes(uids, values, self._clock.now_ms()))

    async def remove(self, routes: Iterable[Route]) -> None:
        """Delete these exact routes (by connection id), 1000 per round trip."""
        await self.unregister_many(Registration(r.uid, r.conn_id) for r in routes)
