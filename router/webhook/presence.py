"""Presence for user.offline and user.online, fenced by per-user epochs
(docs/guides/webhooks.md, "user.offline and user.online").

- A new connection (only a new one: never a heartbeat refresh) gets a new epoch, and the
  gateway adds its user to its own set of users; a user reported offline gets
  user.online with the new epoch, in the same script.
- An unregister that leaves a user no live route schedules ``<epoch>:<uid>`` at now +
  the grace; one that leaves the user no route on this gateway (live ones elsewhere, or
  none) takes the user off the gateway's set, so the set holds the users connected
  there. A sweeper (`router.webhook.sweeper`) sends user.offline for a due entry
  only while the epoch is unchanged (no new connection anywhere since) and the user has
  no live route.
- After each round of its route refresh the gateway lists its users in its set again
  (`list_users`), so the sets come back with the routes after Redis lost its data.
- A crashed gateway never unregisters: its users are scheduled when it restarts (it
  adopts its old set before taking clients) or, if it does not, by a sweeper once it has
  been out of the fleet for two sweeps; an entry whose user still has live routes
  (the crashed gateway's, until their deadline) is checked again at their deadline.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import ScriptRunner
from router.webhook.scripts import ADOPT, CLAIM, CONNECTED, EMPTIED, SETTLE
from shared.clock import Clock
from shared.errors import ImrouteError
from shared.keys import KeySchema
from shared.settings import GatewaySettings

__all__ = ["KEEP_MS", "RedisPresence", "Settled", "adopt_last_run", "from_settings", "retire"]

log = logging.getLogger(__name__)

KEEP_MS = 30 * 86_400_000  # a presence hash outlives its user's last connection this long
ADOPT_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Settled:
    offline: int  # user.offline events sent
    fenced: int  # entries dropped: the user reconnected since
    again: int  # entries checked again later: the user still has live routes
    refused: int  # user.offline events refused by a full outbox

    def __add__(self, other: Settled) -> Settled:
        return Settled(
            self.offline + other.offline,
            self.fenced + other.fenced,
            self.again + other.again,
            self.refused + other.refused,
        )


class RedisPresence:
    """Presence writes of one gateway (`gateway_id`) or the sweepers' reads and settles."""

    def __init__(
        self,
        redis: RedisClient,
        keys: KeySchema,
        clock: Clock,
        *,
        grace_s: float,
        queue_max: int,
        gateway_id: str = "",
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self._grace_ms = int(grace_s * 1000)
        self._queue_max = queue_max
        self._gateway_id = gateway_id
        self._scripts = ScriptRunner(redis, (CONNECTED, EMPTIED, ADOPT, CLAIM, SETTLE))
        self.refused = 0  # presence events this process had refused by a full outbox

    @translate_errors
    async def track(
        self, connected: Sequence[str], emptied: Sequence[str], left: Sequence[str], /
    ) -> None:
        """New connections of `connected` (admitted here); `emptied`: users an
        unregister left without a live route; `left`: users it left with live routes on
        other gateways only. The last two leave this gateway's set. Two round trips at
        most."""
        keys, now = self._keys, self._clock.now_ms()
        if connected:
            args: list[str | int] = [now, KEEP_MS, self._queue_max, keys.presence_prefix()]
            args.append(self._gateway_id)
            for uid in connected:
                args += (uid, json.dumps(uid))
            refused = await self._scripts.run(
                CONNECTED,
                (
                    keys.webhook_events(),
                    keys.webhook_overflow(),
                    keys.gateway_users(self._gateway_id),
                    keys.presence_gateways(),
                ),
                *args,
            )
            self._count_refused(int(refused), "user.online")
        if emptied or left:
            await self._scripts.run(
                EMPTIED,
                (keys.offline_due(), keys.gateway_users(self._gateway_id)),
                *(now, now + self._grace_ms, KEEP_MS, keys.presence_prefix(), len(emptied)),
                *emptied,
                *left,
            )

    @translate_errors
    async def list_users(self, uids: Sequence[str]) -> None:
        """This gateway's set holds `uids` (its users now) again, and the gateways' set
        holds this gateway: after each round of the route refresh, so both come back by
        themselves after Redis lost its data (a restart, a failover), as the routes do;
        until then a crash of this gateway would leave its users without user.offline.
        One round trip per ADOPT_CHUNK users (one slot: `{wh}`)."""
        keys, gateway_id = self._keys, self._gateway_id
        for start in range(0, len(uids), ADOPT_CHUNK):
            pipe = self._redis.pipeline(transaction=False)
            pipe.sadd(keys.gateway_users(gateway_id), *uids[start : start + ADOPT_CHUNK])
            if start == 0:
                pipe.sadd(keys.presence_gateways(), gateway_id)
            await pipe.execute()

    @translate_errors
    async def adopt(self, gateway_id: str) -> int:
        """Schedule every user in `gateway_id`'s set (a gateway gone, or this one's last
        run); returns how many."""
        keys, total = self._keys, 0
        while True:
            now = self._clock.now_ms()
            taken = int(
                await self._scripts.run(
                    ADOPT,
                    (keys.gateway_users(gateway_id), keys.offline_due(), keys.presence_gateways()),
                    *(now, now + self._grace_ms, KEEP_MS, keys.presence_prefix()),
                    *(gateway_id, ADOPT_CHUNK),
                )
            )
            total += taken
            if taken < ADOPT_CHUNK:
                return total

    @translate_errors
    async def gateways(self) -> set[str]:
        """Gateways that hold a set of users."""
        members = await self._redis.smembers(self._keys.presence_gateways())
        return {str(m) for m in members}

    @translate_errors
    async def claim(self, lease_ms: int, limit: int) -> list[tuple[str, str]]:
        """Due entries as (member, uid), each leased for `lease_ms`."""
        now = self._clock.now_ms()
        members = await self._scripts.run(
            CLAIM, (self._keys.offline_due(),), now, now + lease_ms, limit
        )
        return [(m, m.partition(":")[2]) for m in members]

    @translate_errors
    async def settle(self, entries: Sequence[tuple[str, str, int]]) -> Settled:
        """(member, uid, latest live route deadline or 0) of claimed entries."""
        keys = self._keys
        args: list[str | int] = [
            self._clock.now_ms(),
            KEEP_MS,
            self._queue_max,
            keys.presence_prefix(),
        ]
        for member, uid, deadline in entries:
            args += (member, json.dumps(uid), deadline)
        reply = await self._scripts.run(
            SETTLE, (keys.offline_due(), keys.webhook_events(), keys.webhook_overflow()), *args
        )
        settled = Settled(*(int(n) for n in reply))
        self._count_refused(settled.refused, "user.offline")
        return settled

    def _count_refused(self, refused: int, kind: str) -> None:
        if refused:
            self.refused += refused
            log.warning(
                "webhook outbox full (IMROUTE_WEBHOOK_QUEUE_MAX=%d): %d %s events dropped",
                self._queue_max,
                refused,
                kind,
            )


def from_settings(
    settings: GatewaySettings, redis: RedisClient, keys: KeySchema, clock: Clock
) -> RedisPresence | None:
    """A gateway's presence writer, or None while IMROUTE_WEBHOOK_URL is unset (webhooks
    off: nothing is tracked, an unregister stays one HDEL)."""
    if settings.webhook_url is None:
        return None
    return RedisPresence(
        redis,
        keys,
        clock,
        grace_s=settings.webhook_offline_grace_s,
        queue_max=settings.webhook_queue_max,
        gateway_id=settings.gateway_id,
    )


async def adopt_last_run(presence: RedisPresence | None, gateway_id: str) -> None:
    """At a gateway's start, once its id is its own: schedule the users its last run
    admitted (they got no unregister if it crashed). Logged, not raised, on failure."""
    if presence is None:
        return
    try:
        n = await presence.adopt(gateway_id)
    except ImrouteError as exc:  # Redis failed just after the gateway's ping: they get none
        log.warning("last run's users not scheduled for user.offline: %s", exc)
        return
    if n:
        log.info("webhook presence: %d users of this gateway's last run scheduled", n)


async def retire(presence: RedisPresence | None, gateway_id: str) -> None:
    """At a gateway's clean stop, once every client was unregistered: what its set still
    holds is scheduled, as a crashed gateway's would be, and the set goes with it. That
    is the users whose unregister's track failed (Redis did not take it), and those with
    more than 64 routes when their last connection here closed, whom the unregister
    could not tell apart from users still connected here: the sweeper fences those by
    epoch and live route, so they get no user.offline while connected elsewhere. Failing
    that, the set stays for this gateway's next start or a sweeper."""
    if presence is None:
        return
    try:
        n = await presence.adopt(gateway_id)
    except ImrouteError as exc:
        log.warning("users left in this gateway's set not scheduled yet: %s", exc)
        return
    if n:
        log.info("webhook presence: %d users left in this gateway's set scheduled", n)
