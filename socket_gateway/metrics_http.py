"""The gateway's internal HTTP port: `GET /metrics` for Prometheus, and nothing else.

Apart from the clients' WebSocket port, so the counters (connections, refusals, losses)
are not public: bind it to an address only the scraper reaches (IMROUTE_METRICS_HOST,
IMROUTE_METRICS_PORT). A scrape is one short request: the head must come within a few
seconds and keep to the limits every HTTP listener has (shared.http_heads: 431 or 414
in JSON past them, counted), and the connection closes after the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST

from shared.http_answers import closing_answer, json_refusal_answer, refusal_body
from shared.http_heads import END_OF_HEAD, HeadLimits, HeadRefusal, check_head
from shared.throttled import ThrottledLine

if TYPE_CHECKING:
    from shared.settings import GatewaySettings

__all__ = ["refused_heads", "serve_metrics"]

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 5.0


def refused_heads() -> ThrottledLine:
    """The count, and log line, of the request heads the metrics port refuses."""
    return ThrottledLine(log, "refused %(n)d request head(s) on the metrics port: %(detail)s")


async def serve_metrics(
    settings: GatewaySettings, render: Callable[[], bytes], refused: ThrottledLine | None = None
) -> asyncio.Server:
    """Listen on IMROUTE_METRICS_HOST:IMROUTE_METRICS_PORT (0 picks one) and answer
    `GET /metrics` with `render()`. Heads over the limits are refused, counted in
    `refused`."""
    assert settings.metrics_port is not None
    limits = HeadLimits.from_settings(settings)
    refused = refused if refused is not None else refused_heads()

    def refuse(writer: asyncio.StreamWriter, refusal: HeadRefusal) -> None:
        refused.note(detail=refusal.detail)
        writer.write(json_refusal_answer(refusal.status, refusal.error, refusal.detail))

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(END_OF_HEAD), HEAD_TIMEOUT_S)
            except asyncio.LimitOverrunError:  # the reader keeps at most about 2 limits
                refuse(writer, limits.too_large())
                return
            except (TimeoutError, asyncio.IncompleteReadError, OSError):
                return
            refusal = check_head(head, limits)
            if refusal is not None:
                refuse(writer, refusal)
                return
            parts = head.split(b"\r\n", 1)[0].split()
            method, path = (parts[0], parts[1].split(b"?", 1)[0]) if len(parts) == 3 else (b"", b"")
            if path == b"/metrics" and method in (b"GET", b"HEAD"):
                body, status, kind = render(), 200, CONTENT_TYPE_LATEST
            else:
                body = refusal_body("not_found", "this port serves GET /metrics only")
                status, kind = 404, "application/json"
            writer.write(closing_answer(status, kind, body, with_body=method != b"HEAD"))
        finally:
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()

    return await asyncio.start_server(
        answer, settings.metrics_host, settings.metrics_port, limit=limits.max_bytes
    )
