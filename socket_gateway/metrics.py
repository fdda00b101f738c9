"""The gateway's Prometheus metrics, read from its counters when scraped."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sized
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from socket_gateway.delivery import DeliverService
    from socket_gateway.ws.conn import LimitCounts

__all__ = ["Counted", "GatewayMetrics", "render"]


class Counted(Protocol):
    """A part of the gateway that says its own counters for /metrics."""

    def metrics(self) -> dict[str, tuple[str, float]]:
        """name -> (help, value), read at each scrape."""
        ...


class GatewayMetrics(Collector):
    """Batches delivered and dropped, and connections, of one gateway."""

    def __init__(
        self,
        counts: DeliverService,
        connections: Sized,
        recovery: Callable[[], Mapping[str, tuple[str, float]]] | None = None,
        limit_counts: LimitCounts | None = None,
    ) -> None:
        """`recovery`: name -> (help, value) of the recovery counters, read per scrape;
        `limit_counts`: what the client limits refused or closed
        (socket_gateway.ws.ratelimit)."""
        self._counts = counts
        self._connections = connections
        self._recovery = recovery
        self._limit_counts = limit_counts
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        c = self._counts
        yield CounterMetricFamily(
            "imroute_gateway_batches",
            "Batches received (gRPC or bus), delivered or dropped",
            c.batches,
        )
        yield CounterMetricFamily(
            "imroute_gateway_duplicate_batches",
            "Batches dropped because their batch id was already delivered "
            "(bus redeliveries, hedged duplicates)",
            c.duplicates,
        )
        yield CounterMetricFamily(
            "imroute_gateway_expired_batches",
            "Batches dropped because they arrived after their ttl",
            c.expired,
        )
        yield GaugeMetricFamily(
            "imroute_gateway_connections", "Open client connections", len(self._connections)
        )
        # The gRPC stream this counted is gone (the delivery link replaced it): a constant
        # 0, so that dashboards and alerts that read it do not break.
        yield GaugeMetricFamily(
            "imroute_gateway_delivery_streams",
            "Always 0, kept for dashboards: no delivery streams since the delivery link "
            "(see imroute_gateway_delivery_links)",
            0,
        )
        yield GaugeMetricFamily(
            "imroute_gateway_delivery_links",
            "Open delivery links (one per push-service process that pushes here)",
            c.links.open,
        )
        yield CounterMetricFamily(
            "imroute_gateway_delivery_link_refusals",
            "Connections to the delivery link's port refused: no hello in time (TLS "
            "included, from the accept), a bad or used ticket, a failed TLS handshake, too "
            "many waiting (from one address, or in all), or closed for a newcomer",
            c.links.refused,
        )
        if self._limit_counts is not None:
            yield CounterMetricFamily(
                "imroute_gateway_frame_rate_closes",
                "Connections closed (1008) for sending frames faster than "
                "IMROUTE_WS_CLIENT_FRAME_RATE / _BURST",
                self._limit_counts.frame_rate.total,
            )
            yield CounterMetricFamily(
                "imroute_gateway_user_cap_refusals",
                "New connections refused (4429) because their user was at "
                "IMROUTE_MAX_CONNECTIONS_PER_USER live connections",
                self._limit_counts.user_cap.total,
            )
        if self._recovery is not None:
            for name, (text, value) in self._recovery().items():
                yield CounterMetricFamily(f"imroute_gateway_{name}", text, value)


def render(metrics: GatewayMetrics) -> bytes:
    """The exposition text for a scrape."""
    return generate_latest(metrics.registry)
