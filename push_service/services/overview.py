"""GET /v1/admin/overview: what the dashboard shows, in one answer. The fleet by group,
each gateway with its circuit as this process sees it and its rates, the last ten
minutes of the fleet's rates and delivery latency (router.stats), and the latest
broadcasts and multicasts with their progress."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from push_service.services.receipts import ReceiptsView
from router.balancing.stats import StatsRegistry
from router.fleet.cache import CachedFleet
from router.jobs.base import RecentJobs
from router.stats.base import StatsReads
from router.stats.series import points, totals
from shared.clock import Clock
from shared.models import GatewayInfo

__all__ = ["WINDOW_MS", "Overview"]

WINDOW_MS = 10 * 60 * 1000  # what the charts cover
RECENT_MS = 10_000  # what "now" averages (the rates beside each gateway, the tiles)
RECENT_JOBS = 10


@dataclass(frozen=True, slots=True, eq=False)
class Overview:
    fleet: CachedFleet
    stats: StatsReads
    jobs: RecentJobs
    receipts: ReceiptsView
    circuits: StatsRegistry
    clock: Clock

    async def read(self) -> dict[str, Any]:
        now = self.clock.now_ms()
        self.fleet.invalidate()  # fresh, as GET /v1/gateways reads it
        live = await self.fleet.live()
        buckets = await self.stats.read(now - WINDOW_MS, now)
        width = self.stats.bucket_ms
        # The last whole intervals (the current one is still filling).
        recent = [b for b in buckets if now - RECENT_MS - width <= b[0] < now - width]
        seconds = max(len(recent) * width / 1000, 1e-9)
        summed = totals(recent)
        series = points(buckets[:-1], width)
        return {
            "now_ms": now,
            "bucket_ms": width,
            "groups": _groups(live),
            "gateways": [self._gateway(g, summed, seconds, now) for g in live],
            "rates": dict(_average(series[-len(recent) :] if recent else [])),
            "series": series,
            "jobs": await self._recent_jobs(),
        }

    def _gateway(
        self, g: GatewayInfo, summed: dict[str, int], seconds: float, now: int
    ) -> dict[str, Any]:
        gid = g.gateway_id
        return {
            "gateway_id": gid,
            "group_id": g.group_id,
            "zone": g.zone,
            "ws_url": g.ws_url,
            "connections": g.connections,
            "max_connections": g.max_connections,
            "draining": g.draining,
            "circuit": self.circuits.breaker(gid).state.value,
            "heartbeat_age_s": round((now - g.heartbeat_ms) / 1000, 1) if g.heartbeat_ms else None,
            "started_ms": g.started_ms,
            "calls_per_s": round(summed.get(f"calls:{gid}", 0) / seconds, 2),
            "errors_per_s": round(summed.get(f"errors:{gid}", 0) / seconds, 2),
            "batches_per_s": round(summed.get(f"batches:{gid}", 0) / seconds, 2),
        }

    async def _recent_jobs(self) -> list[dict[str, Any]]:
        return [
            await self.receipts.status(j.push_id, j) for j in await self.jobs.recent(RECENT_JOBS)
        ]


def _groups(live: Sequence[GatewayInfo]) -> list[dict[str, Any]]:
    """Per group: its gateways, connections, room, and its share of all connections."""
    total = sum(g.connections for g in live)
    by: dict[str, list[GatewayInfo]] = {}
    for g in live:
        by.setdefault(g.group_id, []).append(g)
    return [
        {
            "group_id": group,
            "gateways": len(members),
            "draining": sum(1 for g in members if g.draining),
            "connections": sum(g.connections for g in members),
            "max_connections": sum(g.max_connections for g in members),
            "share": round(sum(g.connections for g in members) / total, 4) if total else 0.0,
        }
        for group, members in sorted(by.items())
    ]


def _average(series: Sequence[dict[str, Any]]) -> list[tuple[str, float | None]]:
    """Each rate's mean over `series`, and the latency percentiles' latest value."""
    if not series:
        return []
    names = [k for k in series[0] if k not in ("t", "p50", "p99")]
    out: list[tuple[str, float | None]] = [
        (k, round(sum(p[k] for p in series) / len(series), 2)) for k in names
    ]
    for k in ("p50", "p99"):
        latest = next((p[k] for p in reversed(series) if p[k] is not None), None)
        out.append((k, latest))
    return out
