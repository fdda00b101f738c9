"""A real webhook receiver for tests: an HTTP/1.1 server on 127.0.0.1 (stdlib asyncio)
that checks each request's signature with the webhooks page's own receiver code (hmac +
hashlib, not `router.webhook.signing`; `tests.readme`), and collects the events.

    async with WebhookReceiver(SECRET, statuses=[500, 500, 500]) as rx:
        settings(..., webhook_url=rx.url, webhook_secret=SECRET)
        await rx.wait_for(lambda: len(rx.events) == 3, "three events")

`statuses` are the answers to the first requests (then 200); a request whose signature
fails is answered 400, kept in `rejected` (a test asserts it is empty), and its events
are not collected. `stop()` and `start()` take it down and bring it back on its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import Any

from router.processes.ports import free_port
from tests.readme import webhook_verified
from tests.waiting import wait_for

__all__ = ["WebhookReceiver"]


def check_signature(secret: str, body: bytes, header: str, now_s: float) -> str | None:
    """None if `header` signs `body` freshly under `secret` (the webhooks page's `verified`,
    run as the page prints it); else what is wrong."""
    verified = webhook_verified(lambda: now_s)
    if verified(secret, body, header):
        return None
    # Why, told by the same check: with no time limit, then with the right digest.
    t = re.search(r"(?:^|,)[ \t]*t=([0-9]{1,12})", header)
    if t is None:
        return f"malformed header {header[:100]!r}"
    if verified(secret, body, header, 2**40):
        return f"stale t={t[1]}"
    digest = hmac.new(secret.encode(), f"{t[1]}.".encode() + body, hashlib.sha256).hexdigest()
    if verified(secret, body, re.sub(r"v1=[0-9a-f]{64}", f"v1={digest}", header), 2**40):
        return "signature mismatch"
    return f"malformed header {header[:100]!r}"


class WebhookReceiver:
    def __init__(self, secret: str, statuses: list[int] | None = None, port: int = 0) -> None:
        self.secret = secret
        self.statuses = list(statuses or [])
        self.port = port or free_port()
        self.events: list[dict[str, Any]] = []  # accepted (2xx-answered) requests' events
        self.requests: list[tuple[int, int]] = []  # (status answered, events in the body)
        self.rejected: list[str] = []  # requests whose signature did not check
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()  # kept-alive connections, closed by stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._open):  # a receiver that is down answers nobody
                writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def __aenter__(self) -> WebhookReceiver:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def duplicates(self) -> list[str]:
        """event_ids received more than once."""
        return [i for i, n in Counter(e["event_id"] for e in self.events).items() if n > 1]

    async def wait_for(self, cond: Callable[[], bool], what: str, timeout: float = 15) -> None:
        await wait_for(
            cond,
            what,
            timeout,
            every=0.02,
            detail=lambda: (
                f"got {self.events!r}, requests {self.requests}, rejected {self.rejected}"
            ),
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status = self._answer(lines[0], headers, body)
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode("latin-1"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._open.discard(writer)
            writer.close()

    def _answer(self, request_line: str, headers: dict[str, str], body: bytes) -> int:
        if not request_line.startswith("POST ") or "json" not in headers.get("content-type", ""):
            self.rejected.append(f"not a JSON POST: {request_line!r}")
            return 400
        problem = check_signature(
            self.secret, body, headers.get("x-imroute-signature", ""), time.time()
        )
        if problem is not None:
            self.rejected.append(problem)
            return 400
        events = json.loads(body)["events"]
        status = self.statuses.pop(0) if self.statuses else 200
        self.requests.append((status, len(events)))
        if 200 <= status < 300:
            self.events.extend(events)
        return status
