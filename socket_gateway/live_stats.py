"""A gateway's part of the dashboard's figures (router.stats): every second, the
recipients it wrote to, the pushes its clients acked, the batches it took, how long
after the push was accepted it wrote them, and the clients it accepted (its successful
connects, which dispatch weighs against clients' failed ones: router.balancing.connects)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

from router.balancing.connects import CONNECTS
from router.redis.client import RedisClient
from router.stats.sampler import StatsSampler, sampling
from router.stats.store import RedisStatsStore
from shared.clock import Clock
from shared.keys import KeySchema
from shared.settings import GatewaySettings
from socket_gateway.acks import AckReporter
from socket_gateway.connections import LocalConnections
from socket_gateway.delivery import DeliverService

__all__ = ["gateway_sampling"]


class _Parts(Protocol):
    """What it reads of the gateway (socket_gateway.app.Gateway)."""

    clock: Clock
    settings: GatewaySettings
    conns: LocalConnections
    deliver_service: DeliverService
    acks: AckReporter | None


def gateway_sampling(
    redis: RedisClient, keys: KeySchema, gw: _Parts
) -> AbstractAsyncContextManager[StatsSampler]:
    deliver = gw.deliver_service
    batches = f"batches:{gw.settings.gateway_id}"
    connects = CONNECTS + gw.settings.gateway_id

    def counters() -> dict[str, int]:
        acks = gw.acks  # set just before this starts; read each time all the same
        acked = acks.counts.acked if acks is not None else 0
        return {
            "delivered": deliver.delivered,
            "acked": acked,
            batches: deliver.batches,
            connects: gw.conns.added,
        }

    store = RedisStatsStore(redis, keys)
    return sampling(StatsSampler(store, gw.clock, counters, deliver.latency))
