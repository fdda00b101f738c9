"""Keeping this gateway in the fleet: the fleet heartbeat, the route refresh, the drain.

Two loops run for the life of the gateway. The heartbeat re-announces the fleet record,
re-registers every local connection when the record was found missing, and checks for a
drain request (`POST /v1/gateways/{id}/drain`); the route refresh pushes the routes'
deadlines forward. A drain, asked for or run directly, paces the clients' closes.

The periodic route refresh is paced: the routes go in slices of `REFRESH_SLICE`, spread
over half the refresh interval, at the same cadence round after round. All at once, a
5000-connection gateway's refresh was 5000 scripts in a burst every 20 s: tens of ms of
its own loop, and of Redis, while both cores were busy, which stalled pushes on every
process of a small machine (docs/benchmarks/index.md). A re-register after Redis lost the
routes is not paced: those routes are missing, not about to lapse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from router.fleet.base import DrainRequests, GatewayFleet
from router.routes.base import RouteRegistry
from shared.errors import ImrouteError, RegistryUnavailable
from shared.models import GatewayInfo, Registration
from shared.periodic import Periodic
from shared.wire import ws_text_frame
from socket_gateway.connections import LocalConnections
from socket_gateway.pacing import spread
from socket_gateway.ws.endpoint import WsEndpoint

__all__ = [
    "CLOSE_DRAIN",
    "DRAIN_CLOSE_GRACE_S",
    "FLEET_TTL_HEARTBEATS",
    "RECONNECT_FRAME",
    "Drain",
    "Heartbeat",
    "UserListing",
]

log = logging.getLogger(__name__)

# Routes per slice of a paced refresh: one pipeline of a few ms.
REFRESH_SLICE = 100
# A paced refresh spreads its slices over this share of the refresh interval.
REFRESH_SPREAD = 0.5

CLOSE_DRAIN = 4503
RECONNECT_FRAME = b'{"type":"reconnect","reason":"drain"}'
# After the last close of a drain, how long clients get to answer it.
DRAIN_CLOSE_GRACE_S = 5.0
# The fleet record lapses after this many missed heartbeats.
FLEET_TTL_HEARTBEATS = 3


class UserListing(Protocol):
    """Presence (webhooks on): this gateway's users, listed in its set again."""

    async def list_users(self, uids: Sequence[str]) -> None: ...


class Drain:
    """A gateway's drain: `draining` once begun, `drained` set once every client is gone."""

    def __init__(self, conns: LocalConnections) -> None:
        self._conns = conns
        self.draining = False
        self.drained = asyncio.Event()

    async def run(
        self,
        window_s: float,
        endpoint: WsEndpoint,
        fleet: GatewayFleet,
        info: Callable[[], GatewayInfo],
    ) -> None:
        """Stop taking clients, ask each to reconnect elsewhere, and close them (4503)
        spread over `window_s`. Until its close, a client still gets its pushes; each
        close unregisters its route. A second call waits for the first one's end."""
        if self.draining:
            await self.drained.wait()
            return
        self.draining = True
        endpoint.accepting = False
        with contextlib.suppress(ImrouteError):
            await fleet.announce(info())  # draining: dispatch stops choosing it
        self._conns.write_all(ws_text_frame(RECONNECT_FRAME))
        conns = list(self._conns)
        log.info(
            "draining: %d client(s) told to reconnect elsewhere, closed (4503) over %gs",
            len(conns),
            window_s,
        )
        started = asyncio.get_running_loop().time()
        for i, conn in enumerate(conns):
            due = started + window_s * i / max(1, len(conns))
            await asyncio.sleep(max(0.0, due - asyncio.get_running_loop().time()))
            conn.sink.close(CLOSE_DRAIN, "gateway draining: reconnect elsewhere")
        deadline = asyncio.get_running_loop().time() + DRAIN_CLOSE_GRACE_S
        # The connection map has no change event: poll, for a bounded grace.
        while len(self._conns) and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if left := len(self._conns):
            log.warning("drained: %d client(s) did not answer their close in time: aborted", left)
        else:
            log.info("drained: every client closed")
        for conn in list(self._conns):
            conn.sink.abort()  # did not answer the close in time
        self.drained.set()


class Heartbeat:
    """The two loops that keep this gateway chosen and its routes alive."""

    def __init__(
        self,
        gateway_id: str,
        heartbeat_s: float,
        route_ttl_s: float,
        conns: LocalConnections,
        fleet: GatewayFleet,
        registry: RouteRegistry,
        drains: DrainRequests,
        info: Callable[[], GatewayInfo],
        drain: Drain,
        start_drain: Callable[[], Coroutine[Any, Any, None]],
        caught_up: Callable[[Sequence[Registration] | None], object] | None = None,
        presence: UserListing | None = None,
    ) -> None:
        """`start_drain` runs the gateway's drain when a drain request is found;
        `caught_up` is called once the connections were re-registered after the fleet
        record was found missing (the local connections then read what was queued for
        their users meanwhile: `Resumer.catch_up`), and with those whose route a refresh
        found missing (a Redis Cluster shard restarted empty loses the routes on it, not
        the fleet record elsewhere); `presence` (webhooks on) lists the
        local users in this gateway's set again after each round of the refresh."""
        self._gateway_id = gateway_id
        self._interval = heartbeat_s
        self._refresh_s = route_ttl_s / 3
        self._conns = conns
        self._fleet = fleet
        self._registry = registry
        self._drains = drains
        self._info = info
        self._drain = drain
        self._start_drain = start_drain
        self._caught_up = caught_up
        self._presence = presence
        # A loop that died would let every route of this gateway expire while its
        # clients stay connected: a failed beat is logged and the next one comes.
        # The refresh starts a beat every interval however long the last took (the
        # paced refresh takes half of it); the heartbeat leaves an interval between.
        self._loops = (
            Periodic("fleet heartbeat", self.announce, heartbeat_s, log=log, at_once=False),
            Periodic(
                "route refresh",
                self.paced_refresh,
                self._refresh_s,
                log=log,
                at_once=False,
                fixed_rate=True,
            ),
        )
        self._drain_task: asyncio.Task[None] | None = None
        self._reregister: asyncio.Task[None] | None = None
        # Routes of a refresh that failed: perhaps written anew unseen (`paced_refresh`).
        self._unsure: set[Registration] = set()

    def start(self) -> None:
        for loop in self._loops:
            loop.start()

    async def aclose(self) -> None:
        """Cancel the loops and what they started (a re-register, a requested drain)."""
        for task in (self._reregister, self._drain_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for loop in self._loops:
            await loop.stop()

    async def announce(self) -> None:
        """One heartbeat: the fleet record, then a drain request, both within the beat."""
        # A beat may take at most a heartbeat: with the fixed delay between beats, a slow
        # Redis then leaves at most two intervals between records, and the record's TTL
        # is three (a Redis command alone may take IMROUTE_REDIS_TIMEOUT_S, 5 s).
        interval = self._interval
        try:
            async with asyncio.timeout(interval):
                info = self._info()
                found = await self._fleet.announce(info)
                drain = not self._drain.draining and await self._drains.take(
                    self._gateway_id, info.started_ms
                )
        except TimeoutError:
            raise RegistryUnavailable(
                f"announcing the fleet record took over a heartbeat ({interval}s)"
            ) from None
        if not found and (self._reregister is None or self._reregister.done()):
            # Our record was gone: Redis lost its data (a restart, a failover) or was
            # out of reach for a whole TTL. The routes are likely gone too: write every
            # local connection's now, not at the next route refresh. In a task of its
            # own, so that the next beats are not held up by it.
            log.warning("fleet record was missing: re-registering %d connections", len(self._conns))
            self._reregister = asyncio.create_task(self._refresh_logged(), name="re-register")
        if drain:  # POST /v1/gateways/{id}/drain
            self._drain_task = asyncio.create_task(self._start_drain(), name="drain")

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except ImrouteError as exc:
            log.warning("re-registering connections failed (the route refresh retries): %s", exc)
        # Even when some routes are still missing: what was queued can be read already.
        if self._caught_up is not None:
            self._caught_up(None)

    async def paced_refresh(self) -> None:
        """Push every local route's deadline forward, a slice at a time, spread over
        REFRESH_SPREAD of the refresh interval; a slice that fails does not stop the rest."""
        snapshot = self._conns.registrations()
        failed, error, found = 0, None, 0
        unsure = self._unsure
        async for planned in spread(snapshot, REFRESH_SLICE, self._refresh_s * REFRESH_SPREAD):
            # Who left meanwhile is not written back (their unregister went already).
            piece = [r for r in planned if self._conns.holds_registration(r)]
            try:
                missing = await self._registry.refresh(piece)
            except RegistryUnavailable as exc:
                failed, error = failed + len(piece), exc
                # Some may have been written anew, their answers lost with the error (a
                # cluster's other nodes): caught up once a refresh of them goes through.
                unsure.update(piece)
                continue
            if unsure:
                seen = set(missing)
                missing += [r for r in piece if r in unsure and r not in seen]
                unsure.difference_update(piece)
            found += len(missing)
            if missing and self._caught_up is not None:
                self._caught_up(missing)
        unsure.intersection_update(snapshot)  # those that left meanwhile are no one's
        if found:
            log.warning(
                "route refresh: %d of %d routes of live connections were missing (Redis "
                "lost them: a restart, a shard restarted empty, a failover; or they "
                "lapsed): written again, and those connections read what was queued for "
                "them meanwhile",
                found,
                len(snapshot),
            )
        await self._forget_gone(snapshot)
        await self._list_users()
        if error is not None:
            raise RegistryUnavailable(
                f"{failed} of {len(snapshot)} routes not refreshed: {error}"
            ) from error

    async def refresh(self) -> None:
        """Push every local route's deadline forward, at once."""
        snapshot = self._conns.registrations()
        try:
            await self._registry.refresh(snapshot)
        finally:
            await self._forget_gone(snapshot)
        await self._list_users()

    async def _list_users(self) -> None:
        # After Redis lost its data the presence sets come back this way, as the routes
        # do. Only who is connected now: a user who left during the round is not listed
        # again (one whose close lands during this round trip may be, which costs the
        # sweeper a check; user.offline stays once per epoch). Best effort, as every
        # presence write beside the routes is: logged, tried again next round.
        if self._presence is None:
            return
        uids = self._conns.uids()
        try:
            await self._presence.list_users(uids)
        except ImrouteError as exc:
            log.warning("presence: %d users not listed in this gateway's set: %s", len(uids), exc)

    async def _forget_gone(self, snapshot: list[Registration]) -> None:
        # A client that left while the refresh was in flight must not stay routed.
        gone = [r for r in snapshot if not self._conns.holds_registration(r)]
        if gone:
            await self._registry.unregister_many(gone)
