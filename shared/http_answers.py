"""Whole HTTP/1.1 answers as bytes, for the listeners that write their own: the push
service's refusals before a request reaches the app, and a gateway's metrics port.

Each says `Connection: close` (the connection is closed once it is written) and
`X-Content-Type-Options: nosniff`; a refusal's body is `{"error","detail"}` JSON, like
every other refusal of imroute. And what an answer's `Retry-After` asks for, read the
one way by every client here (the CLI, the webhook sender).
"""

from __future__ import annotations

import json
import math
from http import HTTPStatus

__all__ = ["closing_answer", "json_refusal_answer", "refusal_body", "retry_after_s"]


def closing_answer(status: int, content_type: str, body: bytes, with_body: bool = True) -> bytes:
    """A whole response after which the connection is closed (`with_body` False: the
    answer to HEAD, its Content-Length still the body's)."""
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nX-Content-Type-Options: nosniff\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + (body if with_body else b"")


def refusal_body(error: str, detail: str) -> bytes:
    """A refusal's body, `{"error","detail"}` in compact JSON (as FastAPI writes its own),
    whichever listener sends it."""
    return json.dumps({"error": error, "detail": detail}, separators=(",", ":")).encode()


def json_refusal_answer(status: int, error: str, detail: str) -> bytes:
    """A refusal, `{"error","detail"}` in JSON, after which the connection is closed."""
    return closing_answer(status, "application/json", refusal_body(error, detail))


def retry_after_s(value: str | None) -> float | None:
    """The seconds a `Retry-After` value asks to wait, when it is a delay (not an HTTP
    date, not negative, finite); else None. Each caller bounds it as it needs."""
    try:
        seconds = float(value or "")
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
