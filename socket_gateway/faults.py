"""Fault injection for tests and benchmarks: gRPC server interceptors for a real gateway.

`Gateway(settings, grpc_interceptors=[...])` wraps its Deliver service with them. Nothing
in a deployed gateway uses this module; no setting turns it on.

- `FailCalls(n, after=True)` fails the next `n` calls with UNAVAILABLE *after* the batch
  was delivered (the answer is lost on the way back), or before it (`after=False`). On a
  DeliverStream that breaks the stream, failing the other calls on it too.
- `DelayCalls(seconds)` answers every call late, like an overloaded gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import grpc.aio

__all__ = ["DelayCalls", "FailCalls"]

if TYPE_CHECKING:
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
    Continuation: TypeAlias = Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]


class _UnaryInterceptor(grpc.aio.ServerInterceptor):
    """Wraps the behaviour of every unary call, and of every call on a DeliverStream, in
    `around(request, context, inner)`.

    A stream's calls are answered concurrently, as unary calls are (a delay holds up
    only its own call), and an abort in one ends the whole stream, as a broken
    connection would: the router fails every call on it and opens another.
    """

    async def around(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], inner: Any
    ) -> Any:
        raise NotImplementedError

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.rsplit("/", 1)[-1].startswith(
            "Deliver"
        ):
            return handler  # only delivery calls meet the faults (not `Link`)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
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

    def _stream(self, inner_stream: Any) -> Any:
        async def one(call: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            """The inner stream's answer to this one call."""
            async for reply in inner_stream(_single(call), context):
                return reply
            raise RuntimeError("the stream answered nothing")

        async def stream(
            request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            out: asyncio.Queue[Any] = asyncio.Queue()
            tasks: set[asyncio.Task[None]] = set()

            async def answer(call: Any) -> None:
                try:
                    out.put_nowait(await self.around(call, context, one))
                except BaseException as exc:  # an abort ends the stream
                    out.put_nowait(_Failed(exc))

            async def pump() -> None:
                async for call in request_iterator:
                    task = asyncio.create_task(answer(call))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await asyncio.gather(*tasks)
                out.put_nowait(_END)

            reader = asyncio.create_task(pump())
            try:
                while (item := await out.get()) is not _END:
                    if isinstance(item, _Failed):
                        raise item.exc
                    yield item
            finally:
                reader.cancel()
                for task in list(tasks):
                    task.cancel()

        return stream


_END = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _single(item: Any) -> AsyncIterator[Any]:
    yield item


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
