"""Prometheus metrics of what the bus lost, read from its BusLosses when scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from router.bus.losses import BusLosses

__all__ = ["BusLossMetrics"]


class BusLossMetrics(Collector):
    """`imroute_bus_unread_trimmed_total{topic,gateway}` and
    `imroute_bus_groups_dropped_total{topic}` of the publishing process."""

    def __init__(self, losses: BusLosses) -> None:
        self._losses = losses

    def collect(self) -> Iterator[CounterMetricFamily]:
        trimmed = CounterMetricFamily(
            "imroute_bus_unread_trimmed",
            "Redis Streams entries trimmed past IMROUTE_BUS_MAXLEN before a live gateway "
            "had read them (trims done by this process), per topic and gateway",
            labels=["topic", "gateway"],
        )
        for (topic, gateway), n in sorted(self._losses.unread_trimmed.items()):
            trimmed.add_metric([topic, gateway], n)
        yield trimmed
        dropped = CounterMetricFamily(
            "imroute_bus_groups_dropped",
            "Redis Streams consumer groups deleted because they read nothing for "
            "IMROUTE_BUS_GROUP_IDLE_S (gateways that left), per topic",
            labels=["topic"],
        )
        for topic, n in sorted(self._losses.groups_dropped.items()):
            dropped.add_metric([topic], n)
        yield dropped
