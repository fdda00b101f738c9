"""Wrappers that count what the fan-out paths send: bus publishes and redis-py writes."""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import redis.asyncio.connection as aioredis_connection

from router.bus.redis_streams import RedisStreamsBus

__all__ = ["CountingPublisher", "WireWrites"]


class CountingPublisher:
    """The bus as BatchPublisher sees it: counts publishes (one XADD round trip each)."""

    def __init__(self, bus: RedisStreamsBus) -> None:
        self._bus = bus
        self.count = 0
        self.bytes = 0
        self.seconds = 0.0
        self.last_done = 0.0
        self.per_topic: dict[str, int] = {}

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        started = time.perf_counter()
        entry_id = await self._bus.publish(topic, data, attributes)
        self.last_done = time.perf_counter()
        self.seconds += self.last_done - started
        self.count += 1
        self.bytes += len(data)
        self.per_topic[topic] = self.per_topic.get(topic, 0) + 1
        return entry_id


class WireWrites:
    """Counts every write redis-py's asyncio connections make (a command or a pipeline
    is one write; connection handshakes and health checks count too)."""

    def __init__(self) -> None:
        self.count = 0
        self._cls = aioredis_connection.AbstractConnection
        self._original = self._cls.send_packed_command

    def __enter__(self) -> WireWrites:
        original = self._original

        async def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            self.count += 1
            await original(conn, command, check_health)

        self._cls.send_packed_command = counted  # type: ignore[assignment,method-assign]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cls.send_packed_command = self._original  # type: ignore[method-assign]
