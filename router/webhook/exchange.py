"""One webhook POST, bounded in time and in what is read of the answer.

The receiver is the app's server, but it may be broken or hostile, and the sender is a
task in a push service: a POST gets one deadline for all of it (connect, send the body,
receive the answer's head), so an answer dripped a byte at a time ends with the
deadline like silence does; and only the answer's status matters, so at most
ANSWER_READ_BYTES of its body are read (raw, never decompressed), for the log, and the
connection is closed if more follows. A receiver that floods its answer costs the
sender a few KiB; one that stalls it, the deadline.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from shared.http_answers import retry_after_s

__all__ = ["ANSWER_READ_BYTES", "Answer", "Cut", "post_bounded"]

# What is read of an answer's body at most: a JSON reply or a proxy's error page fits
# (and its connection is kept alive); more is cut off and its connection closed.
ANSWER_READ_BYTES = 4096
# What of that body a log line shows.
EXCERPT_CHARS = 200


class Cut(enum.Enum):
    DEADLINE = "deadline"  # no answer (status) by the deadline: a failed attempt
    LONG_ANSWER = "long_answer"  # answered, but its body was longer or not whole by then


@dataclass(frozen=True, slots=True)
class Answer:
    status: int | None  # None: no answer (deadline, refused or broken connection)
    detail: str  # for the log: "HTTP 500 '<excerpt>'", "no answer within 5s", ...
    cut: Cut | None = None
    # A 429's or 503's Retry-After, in seconds (the delta form; an HTTP date is ignored)
    retry_after_s: float | None = None


async def post_bounded(
    http: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    deadline_s: float,
) -> Answer:
    """POST `body`; the answer's status and a few bytes of its body, by `deadline_s`."""
    status: int | None = None
    retry_after: float | None = None
    head = bytearray()
    whole = False
    try:
        async with asyncio.timeout(deadline_s):
            async with http.stream("POST", url, content=body, headers=headers) as response:
                status = response.status_code
                if status in (429, 503):
                    retry_after = retry_after_s(response.headers.get("retry-after"))
                whole = await _read_at_most(response, head, ANSWER_READ_BYTES)
    except TimeoutError:
        if status is None:
            return Answer(None, f"no answer within {deadline_s:g}s", Cut.DEADLINE)
    except (httpx.HTTPError, OSError) as exc:
        # Refused, reset, not HTTP, or a TLS error httpx leaves as it is (an alert while
        # the answer is read): retried. One that answered stands.
        if status is None:
            return Answer(None, f"{type(exc).__name__}: {exc}")
    assert status is not None
    detail = f"HTTP {status}"
    if not 200 <= status < 300 and head:
        detail += f" {bytes(head).decode('utf-8', 'replace')[:EXCERPT_CHARS]!r}"
    return Answer(status, detail, None if whole else Cut.LONG_ANSWER, retry_after)


async def _read_at_most(response: httpx.Response, into: bytearray, limit: int) -> bool:
    """Up to `limit` bytes of the body into `into`; whether that was all of it."""
    async for chunk in response.aiter_raw():  # left unfinished, closed with the response
        room = limit - len(into)
        into += chunk[:room]
        if len(chunk) > room:
            return False
    return True
