"""GET /v1/admin/overview's answer (the dashboard's one read), as the OpenAPI schema
documents it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from push_service.schemas import JobOut

__all__ = ["OverviewOut"]


class GroupOut(BaseModel):
    group_id: str
    gateways: int
    draining: int = Field(description="of its gateways, those draining")
    connections: int
    max_connections: int = Field(description="its gateways' limits summed (0: none set)")
    share: float = Field(description="its part of all connections, 0-1")


class GatewayStatusOut(BaseModel):
    gateway_id: str
    group_id: str
    zone: str | None
    ws_url: str
    connections: int
    max_connections: int
    draining: bool
    circuit: Literal["closed", "open", "half_open"] = Field(
        description="this push-service process's circuit to it"
    )
    heartbeat_age_s: float | None = Field(description="since its record was last written")
    started_ms: int
    calls_per_s: float = Field(description="delivery calls to it, the fleet's push services")
    errors_per_s: float = Field(description="of those, failed")
    batches_per_s: float = Field(description="batches it delivered (calls and the bus)")


class RatesOut(BaseModel):
    """Per second, over one interval (`bucket_ms`), summed over the fleet."""

    p2p: float = Field(description="POST /v1/push calls pushed")
    batch: float = Field(description="messages of POST /v1/push/batch")
    broadcast: float = Field(description="broadcast jobs started")
    multicast: float = Field(description="multicast jobs started")
    queued: float = Field(description="P2P recipients left in their inbox")
    publishes: float = Field(description="bus publish attempts, hedges included")
    hedges: float = Field(description="hedged publish attempts")
    hedge_wins: float = Field(description="publishes a hedge won")
    delivered: float = Field(description="recipients a gateway wrote a push to")
    acked: float = Field(description="pushes a device acked")
    p50: float | None = Field(description="delivery latency, ms (push accepted to written)")
    p99: float | None


class PointOut(RatesOut):
    t: int = Field(description="the interval's start, ms")


class OverviewOut(BaseModel):
    now_ms: int
    bucket_ms: int = Field(description="each point's interval")
    groups: list[GroupOut]
    gateways: list[GatewayStatusOut]
    rates: RatesOut | dict[str, float] = Field(description="the last 10 s (empty: no data yet)")
    series: list[PointOut] = Field(description="the last 10 minutes, oldest first")
    jobs: list[JobOut] = Field(description="the latest broadcasts and multicasts, newest first")
