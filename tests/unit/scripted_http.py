"""An httpx transport that answers from a script, for the operator commands' REST client."""

from __future__ import annotations

from collections.abc import Callable

import httpx

__all__ = ["Answer", "Handler", "scripted"]

# An answer: a response, an exception to raise, or None for no connection at all.
Answer = httpx.Response | Exception | None
Handler = Callable[[httpx.Request], httpx.Response]


def scripted(answers: list[Answer]) -> tuple[Handler, list[httpx.Request]]:
    """A handler for httpx.MockTransport giving `answers` in turn (the last one again
    once they run out), and the requests it was sent."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if answer is None:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return handle, seen
