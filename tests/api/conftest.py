"""The API tier: the push service's ASGI app, its routes and gates, on the in-memory
stores of `router.testing` and a MemoryBus; no Redis (its URL names a closed port, so
a call that reached Redis would fail), no gateway, no sockets."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from push_service.app import create_app
from push_service.ratelimit.base import RateLimit, RateLimiter
from push_service.stores import Stores
from push_service.testing import MemoryIdempotencyStore, MemoryRateLimiter
from router.directory.migrate import upgrade
from router.testing import (
    MemoryBus,
    MemoryDrainRequests,
    MemoryGatewayFleet,
    MemoryJobStore,
    MemoryReceiptStore,
    MemoryRecoveryLog,
    MemoryRouteRegistry,
    MemoryStatsStore,
)
from shared.clock import SystemClock
from shared.settings import PushSettings
from tests.conftest import API_KEY, SECRET

NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1

Api = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@dataclass
class Fakes:
    """The stores the app runs on, for a test to fill before and read after."""

    clock: SystemClock = field(default_factory=SystemClock)
    registry: MemoryRouteRegistry = field(init=False)
    recovery: MemoryRecoveryLog = field(default_factory=MemoryRecoveryLog)
    fleet: MemoryGatewayFleet = field(default_factory=MemoryGatewayFleet)
    drains: MemoryDrainRequests = field(default_factory=MemoryDrainRequests)
    jobs: MemoryJobStore = field(init=False)
    receipts: MemoryReceiptStore = field(init=False)
    stats: MemoryStatsStore = field(default_factory=MemoryStatsStore)
    idempotency: MemoryIdempotencyStore = field(default_factory=MemoryIdempotencyStore)
    bus: MemoryBus = field(default_factory=MemoryBus)
    redis_answers: bool = True  # what GET /healthz is told

    def __post_init__(self) -> None:
        self.registry = MemoryRouteRegistry(self.clock)
        self.jobs = MemoryJobStore(self.clock)
        self.receipts = MemoryReceiptStore(self.recovery)

    async def ping(self) -> bool:
        return self.redis_answers

    def rate_limiter(self, limit: RateLimit) -> RateLimiter:
        return MemoryRateLimiter(limit, self.clock)

    def nothing_sent(self) -> bool:
        """No message was logged, queued or published, and no receipt written."""
        return not (self.recovery.seqs or self.receipts.receipts or self.jobs.jobs)


def settings(db_url: str, **overrides: Any) -> PushSettings:
    base: dict[str, Any] = {
        "redis_url": NO_REDIS,
        "api_key": API_KEY,
        "secret": SECRET,
        "db_url": db_url,
        "gateway_cache_s": 0,
    }
    return PushSettings.load({}, **{**base, **overrides})


_MIGRATED: list[bytes] = []


async def migrated_db(path: Path) -> str:
    """A migrated, empty SQLite user directory at `path` (migrated once per process)."""
    if not _MIGRATED:
        with tempfile.TemporaryDirectory(prefix="imroute-api-db-") as folder:
            first = Path(folder) / "users.db"
            await upgrade(f"sqlite+aiosqlite:///{first}")
            _MIGRATED.append(first.read_bytes())
    path.write_bytes(_MIGRATED[0])  # noqa: ASYNC240 (a few KiB, before the app starts)
    return f"sqlite+aiosqlite:///{path}"


class _Running:
    """The running test's fakes: an app is built once per settings and shared by the
    tests (building one costs a second, its OpenAPI schema), so its stores and bus
    hand each call on to the fakes of the test that runs now."""

    fakes: Fakes | None = None


class _ToCurrent:
    """One of the app's stores (or its bus): the running test's."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(getattr(_Running.fakes, self._name), attr)


def _current_stores() -> Stores:
    def rate_limiter(limit: RateLimit) -> RateLimiter:
        assert _Running.fakes is not None
        return _Running.fakes.rate_limiter(limit)

    async def ping() -> bool:
        assert _Running.fakes is not None
        return await _Running.fakes.ping()

    names = ("registry", "recovery", "fleet", "drains", "jobs", "receipts", "stats")
    return Stores(
        *(_ToCurrent(name) for name in names),  # type: ignore[arg-type]
        idempotency=_ToCurrent("idempotency"),  # type: ignore[arg-type]
        rate_limiter=rate_limiter,
        ping=ping,
    )


_APPS: dict[tuple[tuple[str, Any], ...], tuple[FastAPI, Path]] = {}


@asynccontextmanager
async def serve(
    fakes: Fakes, *, root_path: str = "", **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The app on `fakes`, its lifespan run, and a client of it (settings: `overrides`;
    `root_path`: served under it, as behind uvicorn's --root-path); its user directory
    empty (the database is opened by the lifespan)."""
    key = tuple(sorted(overrides.items()))
    if key not in _APPS:
        db = Path(tempfile.mkdtemp(prefix="imroute-api-")) / "users.db"
        app = create_app(
            settings(f"sqlite+aiosqlite:///{db}", **overrides),
            SystemClock(),
            _ToCurrent("bus"),  # type: ignore[arg-type]
            stores=_current_stores(),
        )
        _APPS[key] = app, db
    app, db = _APPS[key]
    await migrated_db(db)
    _Running.fakes = fakes
    async with fakes.bus:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, root_path=root_path)
            async with httpx.AsyncClient(transport=transport, base_url="http://push") as client:
                yield client


@pytest.fixture
def fakes() -> Fakes:
    return Fakes()


@pytest.fixture
def api(fakes: Fakes) -> Iterator[Api]:
    """`async with api(**settings) as http`: the app on `fakes`."""
    yield functools.partial(serve, fakes)
    _Running.fakes = None
