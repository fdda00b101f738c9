"""The gateway's check of internal calls: the token in each call's metadata.

An interceptor, not a check in the servicer, so a refused call's request is never
parsed (a 16 MiB batch from a stranger costs no protobuf decode) and the answer is
UNAUTHENTICATED before any delivery code runs. mTLS, when on, is checked by the TLS
handshake itself, before any call (`grpc_server.start_grpc_server`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import grpc.aio

from shared.clock import Clock
from shared.internal_auth import token_matches
from shared.throttled import ThrottledLine

__all__ = ["TokenCheck"]

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
    Continuation: TypeAlias = Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]

# A stranger can send many calls: one log line per this many seconds at most.
LOG_EVERY_S = 10.0
REFUSAL = "missing or wrong internal token (IMROUTE_INTERNAL_TOKEN)"


async def _refuse(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)


# Requests stay bytes (no deserializer): nothing from an unauthenticated caller is parsed.
# Every method of the service is unary, so one handler shape refuses them all.
_REFUSE: Handler = grpc.unary_unary_rpc_method_handler(_refuse)


class TokenCheck(grpc.aio.ServerInterceptor):
    """Refuses every call whose metadata lacks the token, counting and logging them."""

    def __init__(self, token: str, clock: Clock) -> None:
        self._token = token.encode()
        # Neither the token sent nor the request is logged: only that calls came.
        self._line = ThrottledLine(
            log,
            f"refused %(n)d gRPC call(s) to %(method)s: {REFUSAL}",
            every_s=LOG_EVERY_S,
            now=clock.monotonic,
        )

    @property
    def refused(self) -> int:
        """Calls refused."""
        return self._line.total

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler | None:
        if token_matches(self._token, handler_call_details.invocation_metadata):
            return await continuation(handler_call_details)
        self._line.note(method=handler_call_details.method)
        return _REFUSE
