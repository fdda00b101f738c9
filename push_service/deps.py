"""What every route needs: the services built by the lifespan, and the API-key check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from router.balancing import StatsRegistry
from router.bus.base import Bus
from router.directory.sql import SqlUserDirectory
from router.fanout.runner import JobRunner
from router.fleet.cache import CachedFleet
from router.fleet.dispatch import Dispatcher
from router.jobs.store import RedisJobStore
from router.p2p.pusher import P2PPusher
from router.redis.client import RedisClient
from router.routes.registry import RedisRouteRegistry
from shared.auth import api_key_matches
from shared.clock import Clock
from shared.errors import AuthError
from shared.settings import Settings

__all__ = ["Key", "Services", "Svc"]


@dataclass
class Services:
    settings: Settings
    clock: Clock
    redis: RedisClient
    registry: RedisRouteRegistry
    fleet: CachedFleet
    pusher: P2PPusher
    bus: Bus
    directory: SqlUserDirectory
    jobs: RedisJobStore
    runner: JobRunner
    dispatcher: Dispatcher
    # per-gateway call stats and circuits, shared by P2P calls and dispatch
    call_stats: StatsRegistry


# Dependencies are async on purpose: FastAPI runs sync ones in a thread pool, which
# cost more CPU per push than the whole route look-up.
async def _services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


_bearer = HTTPBearer(auto_error=False)


async def _require_key(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    if creds is None or not api_key_matches(request.app.state.api_key, creds.credentials):
        raise AuthError("missing or invalid API key (Authorization: Bearer <IMROUTE_API_KEY>)")


Svc = Annotated[Services, Depends(_services)]
Key = Depends(_require_key)
