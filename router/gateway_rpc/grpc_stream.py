"""One long-lived DeliverStream to a gateway, carrying many calls.

A unary call costs gRPC a new HTTP/2 stream, its headers and a deadline on both sides
(about 0.2 ms of CPU each side here); a message on an open stream costs about half. So
the router keeps one stream per gateway channel and sends each DeliverMany on it as a
`StreamCall` with its own id and deadline (`timeout_ms`); the gateway answers each, in
order, with a `StreamReply` of the same id.

- One writer task writes the calls, one at a time (gRPC allows one pending write per
  stream); a call whose caller gave up before its turn is not written.
- One reader task matches replies to callers by id. A reply nobody waits for any more
  (its caller's deadline passed) is dropped.
- A caller waits at most its own deadline, then fails with DEADLINE_EXCEEDED; the
  stream goes on. A write is never cancelled (that would cancel the whole stream).
- When the stream breaks (the gateway died, the channel closed, the gateway refused the
  stream), every call on it fails with the stream's status code, as a unary call on the
  broken connection would (UNAVAILABLE is retried by router.gateway_rpc.resilient), and
  the owner opens a new stream for the next call.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from router.gateway_rpc.base import Batches, Replies
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2

if TYPE_CHECKING:
    from shared.proto.gateway_pb2_grpc import GatewayAsyncStub

__all__ = ["DeliverStream", "Translate", "replies_of", "stream_call"]

log = logging.getLogger(__name__)

_Reply = gateway_pb2.StreamReply

# How a grpc error becomes ours (grpc_client._translate).
Translate = Callable[[str, Exception], GatewayUnavailable]
_GRPC_ERRORS = (grpc.aio.AioRpcError, grpc.aio.BaseError, grpc.RpcError, ValueError)


def stream_call(call_id: int, batches: Batches, timeout_s: float) -> gateway_pb2.StreamCall:
    """One DeliverMany as a StreamCall (on the stream or the delivery link)."""
    return gateway_pb2.StreamCall(
        call_id=call_id, batches=batches, timeout_ms=max(1, math.ceil(timeout_s * 1000))
    )


def replies_of(gateway_id: str, reply: _Reply, batches: Batches, carrier: str) -> Replies:
    """A StreamReply's replies, one per batch in order; GatewayUnavailable when the
    gateway refused the call (its code) or answered another number of batches."""
    if reply.error_code:
        raise GatewayUnavailable(gateway_id, f"{reply.error_code}: {reply.error}", reply.error_code)
    if len(reply.replies) != len(batches):
        raise GatewayUnavailable(gateway_id, f"{carrier} answered the wrong number of batches")
    return list(reply.replies)


class DeliverStream:
    """One DeliverStream RPC; `failed` is set (and stays) once it broke."""

    def __init__(
        self,
        rpc: GatewayAsyncStub,
        gateway_id: str,
        metadata: tuple[tuple[str, str], ...] | None,
        translate: Translate,
    ) -> None:
        self._gateway_id = gateway_id
        self._translate = translate
        self._call = rpc.DeliverStream(metadata=metadata)
        self._pending: dict[int, asyncio.Future[_Reply]] = {}
        self._outbox: deque[tuple[gateway_pb2.StreamCall, asyncio.Future[_Reply]]] = deque()
        self._wake = asyncio.Event()
        self._next_id = 0
        self.failed: GatewayUnavailable | None = None
        self._finishing = False
        self._reader = asyncio.create_task(self._read(), name=f"stream-read:{gateway_id}")
        self._writer = asyncio.create_task(self._write(), name=f"stream-write:{gateway_id}")

    @property
    def gateway_id(self) -> str:
        return self._gateway_id

    @property
    def usable(self) -> bool:
        return self.failed is None and not self._finishing

    async def call(self, batches: Batches, timeout_s: float) -> Replies:
        """One DeliverMany on the stream: the gateway's replies, in order."""
        if self.failed is not None:
            raise self.failed
        if self._finishing:  # being replaced: the retry goes on the next stream
            raise GatewayUnavailable(
                self._gateway_id, "UNAVAILABLE: the stream is closing", "UNAVAILABLE"
            )
        self._next_id += 1
        call_id = self._next_id
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Reply] = loop.create_future()
        self._pending[call_id] = future
        self._outbox.append((stream_call(call_id, batches, timeout_s), future))
        self._wake.set()
        try:
            async with asyncio.timeout(timeout_s):
                reply = await future
        except TimeoutError:
            raise GatewayUnavailable(
                self._gateway_id,
                f"DEADLINE_EXCEEDED: no reply on the stream within {timeout_s:.3f}s",
                "DEADLINE_EXCEEDED",
            ) from None
        finally:
            self._pending.pop(call_id, None)
            if not future.done():
                future.cancel()  # the writer skips it if it was not written yet
        return replies_of(self._gateway_id, reply, batches, "DeliverStream")

    async def _write(self) -> None:
        try:
            while True:
                while not self._outbox:
                    if self._finishing:
                        # Nothing more to send: the gateway answers what it read, then
                        # ends the stream (the reader sees it end).
                        await self._call.done_writing()
                        return
                    self._wake.clear()
                    await self._wake.wait()
                message, future = self._outbox.popleft()
                if future.done():
                    continue  # its caller gave up (deadline) before its turn
                await self._call.write(message)
        except _GRPC_ERRORS as exc:
            self._fail(self._translate(self._gateway_id, exc))
        except Exception as exc:  # a bug: no caller may wait out its deadline for it
            log.exception("delivery stream to %s: the writer failed", self._gateway_id)
            self._fail(GatewayUnavailable(self._gateway_id, f"{type(exc).__name__}: {exc}"))

    async def _read(self) -> None:
        error: GatewayUnavailable
        try:
            while True:
                reply = await self._call.read()
                if reply is grpc.aio.EOF:
                    error = GatewayUnavailable(
                        self._gateway_id, "UNAVAILABLE: the gateway ended the stream", "UNAVAILABLE"
                    )
                    break
                assert isinstance(reply, gateway_pb2.StreamReply)
                future = self._pending.pop(reply.call_id, None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except _GRPC_ERRORS as exc:
            error = self._translate(self._gateway_id, exc)
        except Exception as exc:  # a bug: fail the calls now rather than at their deadlines
            log.exception("delivery stream to %s: the reader failed", self._gateway_id)
            error = GatewayUnavailable(self._gateway_id, f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            error = GatewayUnavailable(
                self._gateway_id, "CANCELLED: the stream closed", "CANCELLED"
            )
            self._fail(error)
            raise
        self._fail(error)

    def _fail(self, error: GatewayUnavailable) -> None:
        if self.failed is None:
            self.failed = error
            if self._pending and not self._finishing:
                log.warning(
                    "delivery stream to %s broke with %d call(s) waiting: %s",
                    self._gateway_id,
                    len(self._pending),
                    error,
                )
        pending = list(self._pending.values())
        self._pending.clear()
        for future in pending:
            if not future.done():
                future.set_exception(error)
        if not self._writer.done():
            self._writer.cancel()
        if not self._call.done():
            self._call.cancel()  # a failed write: the reader must not wait on it

    def finish(self) -> None:
        """Send nothing more: what is queued is written, then the stream is half-closed,
        and it ends once the gateway has answered."""
        self._finishing = True
        self._wake.set()

    async def ended(self, grace_s: float) -> None:
        """Wait (after `finish`) up to `grace_s` for the gateway to end the stream, then
        close it."""
        await asyncio.wait({self._reader}, timeout=grace_s)
        await self.close()

    async def close(self) -> None:
        """Cancel the stream; calls still on it fail."""
        self._finishing = True
        self._call.cancel()
        for task in (self._writer, self._reader):
            task.cancel()
        await asyncio.gather(self._writer, self._reader, return_exceptions=True)
