"""Fault injection for tests and benchmarks: gRPC server interceptors for a real gateway.

`Gateway(settings, grpc_interceptors=[...])` wraps its gRPC delivery calls (DeliverMany)
with them. Nothing in a deployed gateway uses this module; no setting turns it on.

- `FailCalls(n, after=True)` fails the next `n` calls with UNAVAILABLE *after* the batch
  was delivered (the answer is lost on the way back), or before it (`after=False`).
- `DelayCalls(seconds)` answers every call late, like an overloaded gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import grpc.aio

__all__ = ["DelayCalls", "FailCalls"]

if TYPE_CHECKING:
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
    Continuation: TypeAlias = Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]


class _UnaryInterceptor(grpc.aio.ServerInterceptor):
    """Wraps the behaviour of every delivery call (DeliverMany) in
    `around(request, context, inner)`."""

    async def around(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], inner: Any
    ) -> Any:
        raise NotImplementedError

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.rsplit("/", 1)[-1] != "DeliverMany":
            return handler  # only delivery calls meet the faults (not `Link`)
        if handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            return await self.around(request, context, inner)

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class FailCalls(_UnaryInterceptor):
    """Fail the next `count` unary calls with UNAVAILABLE; `after`: once delivered."""

    def __init__(self, count: int = 0, after: bool = True) -> None:
        self.remaining = count
        self.after = after
        self.failed = 0

    def arm(self, count: int, after: bool = True) -> None:
        self.remaining, self.after = count, after

    async def around(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], inner: Any
    ) -> Any:
        if self.remaining <= 0:
            return await inner(request, context)
        self.remaining -= 1
        self.failed += 1
        if self.after:
            await inner(request, context)  # delivered; the answer is what gets lost
        await context.abort(grpc.StatusCode.UNAVAILABLE, "injected transient failure")


class DelayCalls(_UnaryInterceptor):
    """Answer every unary call `seconds` late (0 turns the delay off)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def around(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], inner: Any
    ) -> Any:
        if self.seconds > 0:
            await asyncio.sleep(self.seconds)
        return await inner(request, context)
