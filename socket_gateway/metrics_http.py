"""The gateway's internal HTTP port: `GET /metrics` for Prometheus, and nothing else.

Apart from the clients' WebSocket port, so the counters (connections, refusals, losses)
are not public: bind it to an address only the scraper reaches (IMROUTE_METRICS_HOST,
IMROUTE_METRICS_PORT). A scrape is one short request: the head must come within a few
seconds and fit in 8 KiB, and the connection closes after the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST

__all__ = ["serve_metrics"]

HEAD_TIMEOUT_S = 5.0
MAX_HEAD = 8192


async def serve_metrics(host: str, port: int, render: Callable[[], bytes]) -> asyncio.Server:
    """Listen on `host`:`port` (0 picks one) and answer `GET /metrics` with `render()`."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            writer.close()
            return
        try:
            parts = head.split(b"\r\n", 1)[0].split()
            method, path = (parts[0], parts[1].split(b"?", 1)[0]) if len(parts) == 3 else (b"", b"")
            if path == b"/metrics" and method in (b"GET", b"HEAD"):
                body, status, kind = render(), b"200 OK", CONTENT_TYPE_LATEST.encode()
            else:
                error = {"error": "not_found", "detail": "this port serves GET /metrics only"}
                body, status, kind = (
                    json.dumps(error).encode(),
                    b"404 Not Found",
                    b"application/json",
                )
            writer.write(
                b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n" % (status, kind, len(body))
            )
            if method != b"HEAD":
                writer.write(body)
            with contextlib.suppress(OSError):
                await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(answer, host, port, limit=MAX_HEAD)
