"""Userinfo in Redis: where each live connection of a user lives.

The gateway registers, refreshes and unregisters its connections; the router
looks users up in chunks of at most 1000 per round trip (the bulk reads below say how:
one packed request on standalone Redis, redis-py's pipeline on Redis Cluster). Key
layout: `shared.keys`. A new connection is admitted only while its user has fewer than
`max_per_user` live routes across the fleet, and no write reads the user's whole hash.

A route's value in its user's hash: ``"gateway_id|group_id|ip|port|expires_ms"``.
Written by the gateway, read by every look-up (`encode_route`, `decode_route`,
`group_live_routes`).

How the registry reads many route hashes in one round trip: two ways, chosen per client.

- `BulkHashReads`: standalone Redis; one RESP buffer out, every reply parsed in one go
  (`router.redis.autopipe`), several times cheaper than redis-py's pipeline.
- `PipelineHashReads`: redis-py's non-transactional pipeline. Redis Cluster needs it,
  because the cluster client splits the keys by node; anything that is not a plain
  `redis.asyncio.Redis` (a cluster client, a test's wrapper) gets this one.

Every reply is decoded as text. A route hash is read whole (`HGETALL`, for P2P, which
needs the connection ids) or as values only (`HVALS`, for group multicast): under RESP3,
redis-py 8's default, hiredis turns an `HGETALL` map into a dict about three times more
slowly than it builds the `HVALS` list.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
import redis.exceptions

from router.redis.autopipe import AutoPipeline, RespBulkReader
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
    apply_apart,
    chunks,
)
from shared.clock import Clock
from shared.errors import RegistryRefused, RegistryUnavailable, TooManyConnections
from shared.keys import KeySchema
from shared.models import Registration, Route
from shared.throttled import ThrottledLine

__all__ = [
    "LOOKUP_CHUNK",
    "BulkHashReads",
    "GroupLookup",
    "HashReads",
    "PipelineHashReads",
    "RecipientGroups",
    "RedisRouteRegistry",
    "Registration",
    "RouteRegistry",
    "decode_route",
    "encode_route",
    "group_live_routes",
    "hash_reads_for",
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
        # Route hashes Redis refused to read (a key of another type): their users are
        # looked up as offline, and each refusal logged, one line per 10 s with the count.
        self._unreadable = ThrottledLine(
            log,
            "%(n)d route look-ups refused by Redis since the last line (%(total)d in all; "
            "their users are taken as offline); the last, of %(uid)r: %(error)s",
        )

    @property
    def unreadable(self) -> int:
        """Route reads Redis refused (a key of another type), in all."""
        return self._unreadable.total

    def _note_refused(self, uid: str, error: RegistryRefused) -> None:
        self._unreadable.note(uid=uid, error=error)

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
        """Remove many connections, 1000 per round trip. A chunk that fails does not stop
        the rest; one Redis refused a call of (an error reply: one user's key holds
        another type) goes again op by op, each idempotent, so the others are tracked.
        RegistryUnavailable at the end says how many were left."""
        left, count = 0, 0
        error: RegistryUnavailable | None = None
        for chunk in chunks(RouteOp(False, r.uid, r.conn_id) for r in registrations):
            count += len(chunk)
            try:
                results = await apply_apart(self.apply, chunk)
            except RegistryUnavailable as exc:
                left, error = left + len(chunk), exc
                continue
            for result in results:
                if isinstance(result, RegistryUnavailable):
                    left, error = left + 1, result
        if error is not None:
            raise RegistryUnavailable(f"{left} of {count} routes not removed: {error}") from error

    async def refresh(self, registrations: Iterable[Registration]) -> list[Registration]:
        """Upsert the routes of live connections with a new deadline; returns those whose
        route was not there any more (Redis lost it: a restart, a shard restarted empty,
        a failover; or it lapsed), or may not have been (a chunk written on its second
        try): pushes to them meanwhile found them offline.

        A chunk that fails (a flaky Redis) does not stop the rest: stopping there would
        leave the same users, those past it, unrefreshed round after round until their
        routes lapse while they are connected. Failed chunks are tried once more at the
        end; if any still fail, RegistryUnavailable says how many routes were left (the
        next refresh tries them again)."""
        regs = list(registrations)
        missing: list[Registration] = []
        failed: list[list[Registration]] = []
        for chunk in chunks(regs):
            try:
                missing += self._missing(chunk, await self._run(_refreshes(chunk)))
            except RegistryUnavailable:
                failed.append(chunk)
        left = 0
        error: RegistryUnavailable | None = None
        for chunk in failed:
            try:
                await self._run(_refreshes(chunk))
                # The first try may have written some anew (a cluster's other nodes) and
                # its answers were lost with its error: each counts as missing.
                missing += chunk
            except RegistryUnavailable as exc:
                left += len(chunk)
                error = exc
        if error is not None:
            raise RegistryUnavailable(
                f"{left} of {len(regs)} routes not refreshed (retried once): {error}"
            )
        return missing

    @staticmethod
    def _missing(chunk: list[Registration], replies: list[object]) -> list[Registration]:
        return [r for r, reply in zip(chunk, replies, strict=True) if reply == 2]

    async def apply(self, ops: Sequence[RouteOp]) -> list[bool]:
        """Apply registers and unregisters in order, in one pipelined round trip.

        One flag per op: False for a new connection refused by the per-user cap."""
        replies = await self._run(ops)
        return [
            not (op.register and op.new) or reply != 0
            for op, reply in zip(ops, replies, strict=True)
        ]

    @translate_errors
    async def _run(self, ops: Sequence[RouteOp]) -> list[object]:
        """The scripts' replies to `ops`, in one pipelined round trip."""
        if not ops:
            return []
        presence = self._presence
        if presence is None or all(op.register and not op.new for op in ops):  # refreshes
            # Run again, scripts loaded, when Redis lost them: every operation is idempotent.
            return await self._scripts.many(self._calls(ops))
        async with self._tracking:
            replies = await self._scripts.many(self._calls(ops))
            await self._track(presence, ops, replies)
        return replies

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
            elif reply != 0:  # a reconnect after a close in the same batch undoes it
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
                if isinstance(fields, RegistryRefused):
                    self._note_refused(uid, fields)
                    continue
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
        replies = await self.reads.hvals(uids, prefix=self._keys.route(""))
        values: list[list[str]] = []
        for uid, reply in zip(uids, replies, strict=True):
            if isinstance(reply, RegistryRefused):
                self._note_refused(uid, reply)
                values.append([])  # no live route: offline
            else:
                values.append(reply)
        return RecipientGroups(*group_live_routes(uids, values, self._clock.now_ms()))

    async def remove(self, routes: Iterable[Route]) -> None:
        """Delete these exact routes (by connection id), 1000 per round trip."""
        await self.unregister_many(Registration(r.uid, r.conn_id) for r in routes)


# ------------------------------------------------------------ a route's value (its format)


def encode_route(gateway_id: str, group_id: str, ip: str, port: int, expires_ms: int) -> str:
    """The hash value of one connection's route."""
    return f"{gateway_id}|{group_id}|{ip}|{port}|{expires_ms}"


def decode_route(uid: str, conn_id: str, value: str) -> Route | None:
    """Parse a route value; None for a value this version cannot read."""
    parts = value.split("|")
    if len(parts) != 5:
        return None
    gateway_id, group_id, ip, port, expires_ms = parts
    try:
        return Route(uid, conn_id, gateway_id, group_id, ip, int(port), int(expires_ms))
    except ValueError:
        return None


def group_live_routes(
    uids: Iterable[str], values: Iterable[Sequence[str]], now_ms: int
) -> tuple[int, dict[str, list[str]]]:
    """Group each uid by the group ids of its live route values (`values[i]` is uid i's).

    Returns how many uids have a live route, and the uids of each group in input order;
    a uid with several live routes in one group is listed once for it. The multicast
    look-up's decoder, the hot loop of a 1M-recipient push: no `Route` objects, and each
    distinct "gateway|group|ip|port" part is parsed once per call, so a route costs one
    `rpartition` and one `int`. Values this version cannot read count as no route, as in
    `decode_route`.
    """
    by_group: dict[str, list[str]] = {}
    # "gateway|group|ip|port" -> its group's list in by_group, or None when unreadable.
    members_of: dict[str, list[str] | None] = {}
    online = 0
    for uid, routes in zip(uids, values, strict=True):
        if len(routes) == 1:  # most users: one device
            head, _, deadline = routes[0].rpartition("|")
            try:
                if int(deadline) <= now_ms:
                    continue
            except ValueError:
                continue
            members = members_of.get(head)
            if members is None:
                if head in members_of:
                    continue
                group = _group_of_head(head)
                members = members_of[head] = (
                    None if group is None else by_group.setdefault(group, [])
                )
                if members is None:
                    continue
            members.append(uid)
            online += 1
        elif routes:
            groups = {g for value in routes if (g := _live_group(value, now_ms)) is not None}
            if groups:
                online += 1
                for group in sorted(groups):
                    by_group.setdefault(group, []).append(uid)
    return online, by_group


def _group_of_head(head: str) -> str | None:
    """The group id of a route value's "gateway|group|ip|port" part, if readable."""
    parts = head.split("|")
    if len(parts) != 4:
        return None
    try:
        int(parts[3])
    except ValueError:
        return None
    return parts[1]


def _live_group(value: str, now_ms: int) -> str | None:
    head, _, deadline = value.rpartition("|")
    try:
        if int(deadline) <= now_ms:
            return None
    except ValueError:
        return None
    return _group_of_head(head)


# ------------------------------------------------------------ many route hashes in one round trip


class HashReads(Protocol):
    """Each key's reply, in the keys' order; a key of another type (WRONGTYPE: another
    app's key, a hand edit) is that key's `RegistryRefused`, not the read's, so one bad
    key does not fail the others. Any other error raises, as a read of one key would."""

    async def hgetall(
        self, keys: Sequence[str]
    ) -> Sequence[Mapping[str, str] | RegistryRefused]: ...
    async def hvals(
        self, keys: Sequence[str], prefix: str = ""
    ) -> Sequence[list[str] | RegistryRefused]: ...


def _refused(error: BaseException) -> RegistryRefused:
    """A key's WRONGTYPE reply as its own refusal. Anything else raises, for the read to
    fail (or be tried again) whole: a failover's READONLY or MOVED, a LOADING Redis, a
    connection that broke, and an error of the connection rather than the key (NOAUTH
    on a new connection), which must not pass for a user's being offline."""
    if _wrong_type(error):
        return RegistryRefused(f"redis error: {error}")
    raise error


# A WRONGTYPE reply: as the key's own, or as a raising pipeline annotates it.
_WRONG_TYPE = re.compile(r"(?:Command # \d+ \(.*\) of pipeline caused error: )?WRONGTYPE ")


def _wrong_type(error: BaseException) -> bool:
    return isinstance(error, redis.exceptions.ResponseError) and bool(_WRONG_TYPE.match(str(error)))


class PipelineHashReads:
    """Through redis-py's pipeline: works on every client, Redis Cluster included."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def hgetall(self, keys: Sequence[str]) -> list[Mapping[str, str] | RegistryRefused]:
        return await self._each("hgetall", keys)

    async def hvals(
        self, keys: Sequence[str], prefix: str = ""
    ) -> list[list[str] | RegistryRefused]:
        return await self._each("hvals", [prefix + key for key in keys])

    async def _each(self, command: str, keys: Sequence[str]) -> list[Any]:
        """One pipeline that raises, so the client keeps retrying what it retries (the
        cluster client: a broken connection, a MOVED, CLUSTERDOWN); only where a key was
        of another type, the pipeline again with each key's error in its place."""
        try:
            replies: list[Any] = await self._pipeline(command, keys).execute()
            return replies
        except redis.exceptions.ResponseError as exc:
            if not _wrong_type(exc):
                raise
        replies = await self._pipeline(command, keys).execute(raise_on_error=False)
        return [_refused(r) if isinstance(r, BaseException) else r for r in replies]

    def _pipeline(self, command: str, keys: Sequence[str]) -> Any:
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            getattr(pipe, command)(key)
        return pipe


class BulkHashReads:
    """Through one packed request on a pooled connection of a standalone client; one key
    through the auto-pipeline, if any (sharing a round trip with other tasks' commands)."""

    def __init__(self, redis: aioredis.Redis, auto: AutoPipeline | None = None) -> None:
        self.reader = RespBulkReader(redis)
        self._auto = auto

    async def hgetall(self, keys: Sequence[str]) -> list[Mapping[str, str] | RegistryRefused]:
        replies: list[Any]
        if len(keys) == 1 and self._auto is not None:
            try:
                replies = [await self._auto.execute("HGETALL", keys[0])]
            except redis.exceptions.ResponseError as exc:
                replies = [_refused(exc)]
        else:
            replies = await self._each("HGETALL", keys)
        # RESP3 answers a map (a dict); RESP2 a flat list of field, value, ...
        return [
            r if isinstance(r, dict | RegistryRefused) else dict(zip(r[::2], r[1::2], strict=True))
            for r in replies
        ]

    async def hvals(
        self, keys: Sequence[str], prefix: str = ""
    ) -> list[list[str] | RegistryRefused]:
        """The values of each hash `prefix` + key."""
        return await self._each("HVALS", keys, prefix)

    async def _each(self, command: str, keys: Sequence[str], prefix: str = "") -> list[Any]:
        replies = await self.reader.read_each(command, keys, prefix)
        return [_refused(r) if isinstance(r, redis.exceptions.RedisError) else r for r in replies]


def hash_reads_for(redis: RedisClient, auto: AutoPipeline | None = None) -> HashReads:
    """The bulk reads for a standalone client, the pipeline for anything else."""
    if isinstance(redis, aioredis.Redis):
        return BulkHashReads(redis, auto)
    return PipelineHashReads(redis)


def _refreshes(regs: Sequence[Registration]) -> list[RouteOp]:
    return [RouteOp(True, r.uid, r.conn_id) for r in regs]
