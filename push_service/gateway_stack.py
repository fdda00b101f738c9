"""The push service's gRPC client stack to the gateways (built by push_service.wiring),
and what the fleet cache tells it when gateways leave or restart."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from router.balancing import Listeners, RetryPolicy, StatsRegistry, StatsSettings
from router.gateway_rpc.coalescer import CoalescingGatewayClient
from router.gateway_rpc.grpc_client import GrpcGatewayClients
from router.gateway_rpc.metrics import CallLog, CallMetrics
from router.gateway_rpc.resilient import ResilientGatewayClient
from shared.clock import Clock
from shared.settings import PushSettings

__all__ = ["gateway_clients", "restarted", "retain_all"]


def retain_all(
    clients: CoalescingGatewayClient, call_metrics: CallMetrics
) -> Callable[[Mapping[str, str]], None]:
    """What the fleet cache calls after each read: forget what departed gateways left."""

    def retain(live: Mapping[str, str]) -> None:
        clients.retain(live)
        call_metrics.retain(live)

    return retain


def restarted(
    grpc_clients: GrpcGatewayClients, call_stats: StatsRegistry
) -> Callable[[str, str], None]:
    """What the fleet cache calls when a gateway announces a new start: a new channel
    (the old one may still be backing off from the crash) and a probe of its circuit now."""

    def restarted_(gateway_id: str, address: str) -> None:
        grpc_clients.reconnect(address)
        call_stats.restarted(gateway_id)

    return restarted_


def gateway_clients(
    grpc_clients: GrpcGatewayClients,
    settings: PushSettings,
    clock: Clock,
    call_metrics: CallMetrics,
) -> tuple[CoalescingGatewayClient, StatsRegistry]:
    """gRPC to the gateways: coalesced, with stats, circuit breakers and retries."""
    stats = StatsRegistry(
        clock,
        StatsSettings(
            failure_threshold=settings.circuit_failures, cool_off_s=settings.circuit_cool_off_s
        ),
    )
    # Retries and the circuit count RPCs, below the coalescer: one failed DeliverMany is
    # one failure (and one retry of the whole call), however many pushes it carried.
    resilient = ResilientGatewayClient(
        grpc_clients,
        stats,
        RetryPolicy(max_retries_same=settings.deliver_retries),
        listeners=Listeners([call_metrics, CallLog()]),
    )
    return CoalescingGatewayClient(resilient, per_turn=True), stats
