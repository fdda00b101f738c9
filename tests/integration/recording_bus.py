"""The fan-out's publishes, kept in memory: a bus that records, and the message they carry."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from shared.clock import SystemClock
from shared.models import Message
from shared.proto import gateway_pb2

__all__ = ["RecordingBus", "message"]


class RecordingBus:
    """A bus that keeps what was published (each batch decoded) and when."""

    def __init__(self) -> None:
        self.published: list[tuple[str, gateway_pb2.Batch, dict[str, str]]] = []
        self.times: list[float] = []

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        self.published.append((topic, gateway_pb2.Batch.FromString(data), dict(attributes or {})))
        self.times.append(asyncio.get_running_loop().time())
        return str(len(self.published))


def message() -> Message:
    """A message \"hi\", sent now."""
    return Message("m1", "p1", 0, "admin", b'"hi"', SystemClock().now_ms())
