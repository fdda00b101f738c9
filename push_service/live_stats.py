"""The push service's part of the dashboard's figures (router.stats): its pushes by
endpoint, recipients left queued, jobs started, bus publishes and hedges, and its calls
to each gateway (and their failures), and the failed connects clients reported through
dispatch (`connect_failures:<gateway>`, router.balancing.connects)."""

from __future__ import annotations

from collections.abc import Callable

from push_service.services import FanOut, Pushes
from router.balancing import ConnectReports, StatsRegistry
from router.hedging.metrics import PublishMetrics

__all__ = ["process_counts"]


def process_counts(
    pushes: Pushes,
    fanout: FanOut,
    publishes: PublishMetrics,
    calls: StatsRegistry,
    connects: ConnectReports | None = None,
) -> Callable[[], dict[str, int]]:
    """This process's cumulative counts, read by its sampler every second."""

    def counts() -> dict[str, int]:
        out = {
            "p2p": pushes.pushed,
            "batch": pushes.batched,
            "queued": pushes.queued,
            "broadcast": fanout.started["broadcast"],
            "multicast": fanout.started["multicast"],
            "publishes": publishes.publishes,
            "hedges": publishes.hedges,
            "hedge_wins": publishes.hedge_wins,
        }
        for gateway_id in calls.known():
            st = calls.stats(gateway_id)
            out[f"calls:{gateway_id}"] = st.successes + st.failures
            out[f"errors:{gateway_id}"] = st.failures
        if connects is not None:
            out.update(connects.counts())
        return out

    return counts
