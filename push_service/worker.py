"""One worker of several (IMROUTE_WORKERS, push_service.workers): its socket, its number,
and /metrics for all of them.

A scrape reaches whichever worker accepts its connection, so each worker serves its own
metrics on a Unix socket in the folder the supervisor made (`<n>.sock`), and the one
that answers /metrics reads its siblings' there and merges them (`merge_scrapes`) into
the series one process would give: counts summed, gauges at their highest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["Worker", "merge_scrapes"]

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Worker:
    """What the supervisor tells a worker: the socket's descriptor, its number, and the
    folder the workers share."""

    fd: int
    index: int
    folder: str

    def listener(self) -> socket.socket:
        """The listening socket every worker accepts on (its family read from the fd)."""
        return socket.socket(fileno=self.fd)

    def _path(self, index: int | str, suffix: str) -> Path:
        return Path(self.folder) / f"{index}.{suffix}"

    def mark_ready(self) -> None:
        """Tell the supervisor this worker started (a worker that exits before it did
        failed to start, and is not started again)."""
        self._path(self.index, "ready").touch()

    @contextlib.asynccontextmanager
    async def sharing_metrics(self, scrape: Callable[[], bytes]) -> AsyncIterator[None]:
        """Serve this worker's own scrape on its Unix socket while the block runs."""

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                writer.write(scrape())
                await writer.drain()
            finally:
                writer.close()

        path = self._path(self.index, "sock")
        path.unlink(missing_ok=True)
        server = await asyncio.start_unix_server(answer, path=str(path))
        try:
            yield
        finally:
            server.close()
            path.unlink(missing_ok=True)

    def _siblings(self) -> list[Path]:
        # A few entries in a folder of our own: listed without a thread.
        socks = Path(self.folder).glob("*.sock")
        return sorted(p for p in socks if p.stem != str(self.index))

    async def scrape_all(self, own: bytes) -> bytes:
        """Every worker's metrics, merged as one process's would be (`merge_scrapes`)."""
        scrapes = {str(self.index): own}
        siblings = self._siblings()
        texts = await asyncio.gather(*(_read(p) for p in siblings))
        for path, text in zip(siblings, texts, strict=True):
            if text is not None:
                scrapes[path.stem] = text
        return merge_scrapes(scrapes)


async def _read(path: Path) -> bytes | None:
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            reader, writer = await asyncio.open_unix_connection(str(path))
            try:
                return await reader.read()
            finally:
                writer.close()
    except (OSError, TimeoutError) as exc:
        # A worker restarting: its metrics are missing from this one scrape.
        log.warning("could not read the metrics of worker %s: %s", path.stem, exc)
        return None


class _Merged:
    """A collector of the parsed families (prometheus_client renders them again)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


# Counts add up across workers: the service's counter is the sum of its workers'.
SUMMED = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
# ...except what each reads from shared state, which says so in its help text.
FLEET_WIDE = "fleet-wide"


def merge_scrapes(scrapes: dict[str, bytes]) -> bytes:
    """Prometheus text scrapes of several workers as one, with the series a single
    process would give: each counter, histogram and summary sample summed over the
    workers, unless its help says it is "fleet-wide" (each worker read it from Redis);
    every other sample (gauges, fleet-wide counts) their highest value, as most gauges here read
    state the workers share (the webhook queue's length in Redis) or say how bad
    something is (a gateway's breaker state). Each family once."""
    families: dict[str, Metric] = {}
    merged: dict[tuple[str, str, tuple[tuple[str, str], ...]], Sample] = {}
    for text in scrapes.values():
        for family in text_string_to_metric_families(text.decode()):
            if family.name not in families:
                families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            # A fleet-wide figure (read from Redis) is the same in every worker.
            summed = family.type in SUMMED and FLEET_WIDE not in family.documentation
            for s in family.samples:
                key = (family.name, s.name, tuple(sorted(s.labels.items())))
                seen = merged.get(key)
                if seen is None:
                    value = s.value
                elif s.name.endswith("_created"):  # the earliest worker's start
                    value = min(s.value, seen.value)
                else:
                    value = s.value + seen.value if summed else max(s.value, seen.value)
                merged[key] = Sample(s.name, s.labels, value, None)
    for (name, _, _), sample in merged.items():
        families[name].samples.append(sample)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(families.values()))
    return generate_latest(registry)
