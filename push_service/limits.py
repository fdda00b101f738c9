"""A pure-ASGI request body limit: oversized bodies get 413 before anything is parsed."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from push_service.access import route_path
from push_service.errors import send_error

__all__ = ["BodyLimit"]


class BodyLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, per_path: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.per_path = dict(per_path or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.per_path.get(route_path(scope), self.max_bytes)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await self._reject(send, limit)
                return
        seen = 0
        rejected = False

        async def counting_receive() -> Message:
            nonlocal seen, rejected
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # Answer here: an exception would be turned into a 400 by the app's
                    # body parsing before it reached us. The app then sees a disconnect.
                    rejected = True
                    await self._reject(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not rejected:  # the 413 is the whole answer
                await send(message)

        await self.app(scope, counting_receive, guarded_send)

    async def _reject(self, send: Send, limit: int) -> None:
        await send_error(send, 413, "payload_too_large", f"request body over {limit} bytes")
