"""Pure P2P planning: group recipients by gateway, and merge the gateways' answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shared.models import Message, Route


@dataclass(slots=True)  # not frozen: one per message; frozen costs 5x to build
class Outgoing:
    """One message of a batch of P2P pushes (`P2PPusher.push`; a push is a batch of one)."""

    message: Message
    uids: Sequence[str]
    expires_ms: int = 0
    store: bool = True


__all__ = [
    "UNKNOWN_ERROR",
    "DeliveryPlan",
    "GatewayOutcome",
    "Outgoing",
    "PushOutcome",
    "Target",
    "gateway_outcome",
    "merge",
    "plan_p2p",
    "unrouted",
]


@dataclass(slots=True)
class Target:
    """One gateway's part of a push: the gateway and every recipient it holds (its batch,
    in that gateway's call)."""

    gateway_id: str
    address: str
    uids: list[str] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    # Not in the live fleet, though its routes are: its state is unknown (it may be cut
    # off from Redis and still serving its clients, or dead with routes not yet lapsed).
    unknown: bool = False


@dataclass(frozen=True, slots=True)
class DeliveryPlan:
    targets: dict[str, Target]
    offline: list[str]
    # Routes pointing at a gateway the live fleet has at another address (it restarted
    # elsewhere: routes of its previous life): never called.
    stale: list[Route]
    # Routes of gateways missing from the live fleet: called at the route's address, and
    # a failure says the gateway's state is unknown rather than the user offline.
    unknown: list[Route] = field(default_factory=list)


UNKNOWN_ERROR = (
    "GATEWAY_STATE_UNKNOWN: {gateway} is not in the live fleet (its heartbeat did not "
    "reach Redis) while routes to it are; it may be cut off from Redis or dead, and "
    "its users still connected: {error}"
)


def plan_p2p(
    uids: Sequence[str],
    routes: Mapping[str, Sequence[Route]],
    live_gateways: Mapping[str, str] | None,
) -> DeliveryPlan:
    """Group each uid under every live gateway that holds one of its connections.

    `live_gateways` maps each live gateway id to the gRPC address it announces. A
    gateway that restarted elsewhere (a new pod IP, a new port) still has routes written
    by its previous life until they expire, and those must not be called (`stale`). A
    route of a gateway missing from the fleet altogether is live (its gateway wrote it
    within the route TTL) but the gateway's state is unknown: it is called at the
    route's address (`unknown`). None means the fleet is unknown and every route is tried.
    """
    targets: dict[str, Target] = {}
    offline: list[str] = []
    stale: list[Route] = []
    unknown: list[Route] = []
    for uid in uids:
        reachable = False
        for route in routes.get(uid, ()):
            missing = False
            if live_gateways is not None:
                address = live_gateways.get(route.gateway_id)
                if address is None:
                    missing = True
                    unknown.append(route)
                elif address != route.grpc_address:
                    stale.append(route)
                    continue
            target = targets.get(route.gateway_id)
            if target is None:
                target = targets[route.gateway_id] = Target(
                    route.gateway_id, route.grpc_address, unknown=missing
                )
            if not target.uids or target.uids[-1] != uid:
                target.uids.append(uid)
            target.routes.append(route)
            reachable = True
        if not reachable:
            offline.append(uid)
    return DeliveryPlan(targets, offline, stale, unknown)


@dataclass(slots=True)  # not frozen: one per message; frozen costs 5x to build
class GatewayOutcome:
    """What one gateway answered, or why it could not."""

    gateway_id: str
    delivered: Sequence[str] = ()
    missing: Sequence[str] = ()
    error: str | None = None
    # The error suggests the gateway may be gone (it could not be reached): worth a
    # fresh look at the fleet. Not so for an open circuit, an expired push, or a call
    # the gateway answered with an error.
    suspect: bool = False


EXPIRED_ERROR = "EXPIRED: reached the gateway after its ttl_s or the call's deadline; not written"


class Reply(Protocol):
    """What a gateway answers of one batch (a DeliverReply)."""

    @property
    def delivered(self) -> Sequence[str]: ...
    @property
    def missing(self) -> Sequence[str]: ...
    @property
    def expired(self) -> bool: ...
    @property
    def duplicate(self) -> bool: ...


def gateway_outcome(target: Target, reply: Reply) -> GatewayOutcome:
    """What a gateway's reply to one target's batch says of its recipients.

    A retry of a batch the gateway wrote, whose first answer it no longer holds (its
    reply cache is bounded), comes back `duplicate` with nothing listed: the batch went
    out, so its recipients count as delivered, though some may have been missing."""
    if reply.expired:
        return GatewayOutcome(target.gateway_id, error=EXPIRED_ERROR)
    if reply.duplicate and not reply.delivered and not reply.missing:
        return GatewayOutcome(target.gateway_id, target.uids, ())
    return GatewayOutcome(target.gateway_id, reply.delivered, reply.missing)


@dataclass(slots=True)  # not frozen: one per message; frozen costs 5x to build
class PushOutcome:
    delivered: list[str]
    offline: list[str]
    # Recipients that had routes, but whose every gateway failed, or whose routes could
    # not be read (`unrouted`): not delivered.
    failed: list[str]
    errors: list[GatewayOutcome]
    # Routes the gateways said they no longer hold: safe to delete.
    gone: list[Route]
    # Offline or failed recipients whose message waits in their inbox.
    queued: list[str] = field(default_factory=list)
    # Failed recipients whose gateway answered that the push had expired (not written).
    expired: list[str] = field(default_factory=list)
    # A stored push: each recipient's place in its log (`shared.positions`), from which
    # its receipt tells when a device acked it. Empty: not stored.
    positions: Mapping[str, int] = field(default_factory=dict)


def unrouted(uids: Sequence[str], error: Exception) -> PushOutcome:
    """A stored push whose recipients' routes could not be read: each one failed (and
    waits in the inbox, tried again in the background), `error` saying why."""
    return PushOutcome(
        [], [], list(uids), [GatewayOutcome("*", error=f"route look-up failed: {error}")], []
    )


def merge(
    uids: Sequence[str], plan: DeliveryPlan, outcomes: Sequence[GatewayOutcome]
) -> PushOutcome:
    """Per recipient: delivered if any gateway delivered, failed if one errored, else offline."""
    if not outcomes:
        return PushOutcome([], list(uids), [], [], [])
    if len(uids) == 1 and len(outcomes) == 1:  # the batch endpoint's usual message
        only = outcomes[0]
        if only.error is None and not only.missing and uids[0] in only.delivered:
            return PushOutcome([uids[0]], [], [], [], [])
    delivered: set[str] = set()
    errored: set[str] = set()
    expired: set[str] = set()
    gone: list[Route] = []
    errors: list[GatewayOutcome] = []
    for outcome in outcomes:
        target = plan.targets[outcome.gateway_id]
        if outcome.error is not None:
            errored.update(target.uids)
            if outcome.error.startswith("EXPIRED"):
                expired.update(target.uids)
            if target.unknown:
                error = UNKNOWN_ERROR.format(gateway=target.gateway_id, error=outcome.error)
                errors.append(GatewayOutcome(outcome.gateway_id, error=error, suspect=True))
            else:
                errors.append(outcome)
            continue
        delivered.update(outcome.delivered)
        missing = set(outcome.missing)
        gone.extend(r for r in target.routes if r.uid in missing)
    result_delivered: list[str] = []
    failed: list[str] = []
    offline: list[str] = []
    for uid in uids:
        if uid in delivered:
            result_delivered.append(uid)
        elif uid in errored:
            failed.append(uid)
        else:
            offline.append(uid)
    gone_by_expiry = [u for u in failed if u in expired]
    return PushOutcome(result_delivered, offline, failed, errors, gone, expired=gone_by_expiry)
