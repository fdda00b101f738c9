"""What one bounded webhook POST makes of an answer (httpx's mock transport; the real
sockets are in tests/integration/test_webhook_limits.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

import httpx

from router.webhook.exchange import ANSWER_READ_BYTES, Answer, Cut, post_bounded


def answer(status: int, body: bytes = b"") -> httpx.Response:
    """A streamed answer, as a real transport gives (not one read already)."""
    return httpx.Response(status, stream=httpx.ByteStream(body))


async def post(handler: Callable[[httpx.Request], Any], deadline_s: float = 1.0) -> Answer:
    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport) as http:
        return await post_bounded(http, "http://rx/hooks", b"{}", {}, deadline_s)


async def test_a_short_answer_is_read_whole_and_a_refusal_shows_its_start() -> None:
    assert await post(lambda _: answer(204)) == Answer(204, "HTTP 204")
    refused = await post(lambda _: answer(400, b'{"error":"bad\nline"}'))
    assert refused == Answer(400, "HTTP 400 " + repr('{"error":"bad\nline"}'))


async def test_a_long_answer_is_cut_and_its_status_stands() -> None:
    exact = await post(lambda _: answer(200, b"x" * ANSWER_READ_BYTES))
    assert exact == Answer(200, "HTTP 200")
    long = await post(lambda _: answer(503, b"y" * (ANSWER_READ_BYTES + 1)))
    assert (long.status, long.cut) == (503, Cut.LONG_ANSWER)
    assert long.detail == f"HTTP 503 {'y' * 200!r}"  # the excerpt, bounded


async def test_no_answer_by_the_deadline_is_a_cut_without_a_status() -> None:
    async def stalls(_: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return answer(200)

    assert await post(stalls, deadline_s=0.05) == Answer(
        None, "no answer within 0.05s", Cut.DEADLINE
    )


async def test_a_connection_error_is_no_answer_and_no_cut() -> None:
    def refuses(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    assert await post(refuses) == Answer(None, "ConnectError: refused")


async def test_a_tls_error_httpx_does_not_map_is_no_answer_too() -> None:
    """httpcore maps TLS errors only during the handshake: an alert while the answer is
    read comes as ssl.SSLError. It escaped, and ended the sender's task for good (an
    audit's TLS receiver sending a corrupt record did it)."""

    def corrupt(_: httpx.Request) -> httpx.Response:
        raise ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC] bad record mac")

    got = await post(corrupt)
    assert got.status is None and got.cut is None
    assert got.detail.startswith("SSLError: ") and "BAD_RECORD_MAC" in got.detail


async def test_a_busy_receivers_retry_after_is_kept_in_seconds_only() -> None:
    def busy(status: int, after: str) -> Callable[[httpx.Request], httpx.Response]:
        # Bytes, as they come off the wire (read back as latin-1)
        head = [(b"retry-after", after.encode("latin-1"))]
        return lambda _: httpx.Response(status, headers=head, stream=httpx.ByteStream(b""))

    assert (await post(busy(429, "7"))).retry_after_s == 7.0
    assert (await post(busy(503, " 2 "))).retry_after_s == 2.0
    assert (await post(busy(429, "Wed, 21 Oct 2026 07:28:00 GMT"))).retry_after_s is None
    assert (await post(busy(429, "-1"))).retry_after_s is None
    assert (await post(busy(429, "\u00b2"))).retry_after_s is None  # a digit, not decimal
    assert (await post(busy(500, "7"))).retry_after_s is None  # only where it means "later"
