"""Wrappers that count what the fan-out paths send: bus publishes and redis-py writes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import redis.asyncio as aioredis
import redis.asyncio.connection as aioredis_connection

from router.bus.redis_streams import RedisStreamsBus

__all__ = ["CountingPublisher", "WireWrites", "directory_uid", "stream_entries"]


def directory_uid(i: int) -> str:
    """The fan-out benches' recipients: u0000000, u0000001, ..."""
    return f"u{i:07d}"


class CountingPublisher:
    """The bus as BatchPublisher sees it: counts publishes (one XADD round trip each)."""

    def __init__(self, bus: RedisStreamsBus) -> None:
        self._bus = bus
        self.count = 0
        self.bytes = 0
        self.seconds = 0.0
        self.last_done = 0.0
        self.per_topic: dict[str, int] = {}

    @property
    def logs_topics(self) -> bool:
        """As the bus: whether its publish logs the batch (`LogsTopics`)."""
        return self._bus.logs_topics

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

    def __exit__(self, *exc: object) -> None:
        self._cls.send_packed_command = self._original  # type: ignore[method-assign]


async def stream_entries(url: str, stream: str) -> AsyncIterator[dict[bytes, bytes]]:
    """The fields of every entry of a bus stream, oldest first, read 200 at a time."""
    client = aioredis.Redis.from_url(url, decode_responses=False)
    try:
        start = "-"
        while entries := await client.xrange(stream, min=start, count=200):
            for _entry_id, fields in entries:
                yield cast(dict[bytes, bytes], fields)
            start = "(" + cast(bytes, entries[-1][0]).decode()  # exclusive: after the last one
    finally:
        await client.aclose()
