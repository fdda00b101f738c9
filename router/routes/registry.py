"""Userinfo in Redis: where each live connection of a user lives.

The gateway registers, refreshes and unregisters its connections; the router
looks users up in chunks of at most 1000 per round trip (`router.routes.reads` says how:
one packed request on standalone Redis, redis-py's pipeline on Redis Cluster). Key
layout: `shared.keys`. A new connection is admitted only while its user has fewer than
`max_per_user` live routes across the fleet, and no write reads the user's whole hash.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import Script, ScriptRunner
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

# The writes' scripts (`upsert.lua`, `remove.lua`: their comments say what they do).
_UPSERT = Script.load(
    __package__,
    "upsert",
    prelude=f"local SWEEP_SAMPLE, REAP_SAMPLE = {SWEEP_SAMPLE}, {REAP_SAMPLE}\n",
)
_REMOVE = Script.load(__package__, "remove")


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
        connections, of users left without a live route and of users left without one
        on this gateway (webhooks on; otherwise an unregister stays a plain HDEL)."""
        self._redis = redis
        self.max_per_user = max_per_user
        self.reads = reads or hash_reads_for(redis)
        self._keys = keys
        self._clock = clock
        self._ttl_ms = int(ttl_s * 1000)
        self._where = (gateway_id, group_id, ip, port)
        self._scripts = ScriptRunner(redis, (_UPSERT, _REMOVE))
        self._presence = presence
        # Presence writes one at a time (the route writer's batches, and the heartbeat's
        # unregisters beside them): a close's verdict, "no route of this user here",
        # must not be tracked after a reconnect here that followed it was.
        self._tracking = asyncio.Lock()

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
        presence = self._presence
        if presence is None or all(op.register and not op.new for op in ops):  # refreshes
            # Run again, scripts loaded, when Redis lost them: every operation is idempotent.
            replies = await self._scripts.many(self._calls(ops))
        else:
            async with self._tracking:
                replies = await self._scripts.many(self._calls(ops))
                await self._track(presence, ops, replies)
        return [
            not (op.register and op.new) or reply == 1
            for op, reply in zip(ops, replies, strict=True)
        ]

    async def _track(
        self, presence: ConnectionEvents, ops: Sequence[RouteOp], replies: list[object]
    ) -> None:
        connected: list[str] = []
        # Each user's last verdict in the batch, in order: 0 a route here (or too many
        # to tell), 1 no live route left, 2 live routes only on other gateways.
        last: dict[str, object] = {}
        for op, reply in zip(ops, replies, strict=True):
            if not op.register:
                last[op.uid] = reply
            elif reply == 1:  # a reconnect after a close in the same batch undoes it
                last[op.uid] = 0
                if op.new:
                    connected.append(op.uid)
        emptied = [uid for uid, verdict in last.items() if verdict == 1]
        left = [uid for uid, verdict in last.items() if verdict == 2]
        if not connected and not emptied and not left:
            return
        try:
            await presence.track(connected, emptied, left)
        except RegistryUnavailable as exc:
            # The routes are written; only presence lags. A missed epoch is caught by the
            # sweeper's live-route check, a missed schedule by the gateway's set.
            n = len(connected) + len(emptied) + len(left)
            log.warning("presence of %d users not tracked: %s", n, exc)

    def _calls(self, ops: Sequence[RouteOp]) -> list[tuple[object, ...]]:
        now = self._clock.now_ms()
        value = self._value(now)
        cap = self.max_per_user
        calls: list[tuple[object, ...]] = []
        for op in ops:
            key = self._keys.route(op.uid)
            if op.register:
                args = (op.conn_id, value, now, self._ttl_ms, cap if op.new else 0)
                calls.append(_UPSERT.args((key,), *args))
            elif self._presence is not None:
                calls.append(_REMOVE.args((key,), op.conn_id, now, self._where[0]))
            else:
                calls.append(("HDEL", key, op.conn_id))
        return calls

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
