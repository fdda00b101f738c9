"""Single Redis commands from concurrent tasks, sent together: one round trip per loop tick.

Each P2P push makes a few single commands (its recipients' routes, the log-and-inbox
script, the receipt script), and at hundreds of pushes a second redis-py spends more CPU
on each command's round trip (a pooled connection taken and given back, a retry wrapper,
a timeout, a write and a read) than on the command. Here every command issued during one
turn of the event loop is packed into one RESP buffer and sent on one pooled connection
(`RespBulkReader.run`, hiredis parsing every reply in one go), and each caller gets its
own reply, or its own error: an error reply (raised as redis-py's class for it: NOSCRIPT
as NoScriptError, so script runners load and retry as before, READONLY as ReadOnlyError)
fails only its own command. Commands keep their order within a round trip, and each
round trip runs as soon as its tick ends, so no command waits for another's reply.

Standalone Redis only, like the bulk reads: a Redis Cluster client routes each command
by its key (`auto_pipeline_for` gives None for it, and callers use the client).
Replies are decoded as UTF-8, as the clients here do (`decode_responses=True`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
import redis.exceptions

from router.redis.client import RedisClient
from router.routes.bulk_read import RespBulkReader, reply_error
from shared.tasks import Background

__all__ = ["AutoPipeline", "auto_pipeline_for", "pack_command"]

log = logging.getLogger(__name__)

MAX_PER_TRIP = 1000  # commands packed into one request, at most
_hiredis_pack: Callable[[tuple[Any, ...]], bytes] = hiredis.pack_command


def _arg(value: Any) -> bytes:
    kind = type(value)
    if kind is str:
        return value.encode()  # type: ignore[no-any-return]
    if kind is bytes:
        return value  # type: ignore[no-any-return]
    if kind is int:
        return b"%d" % value
    if isinstance(value, bool):  # as redis-py: a bool is not a Redis value
        raise redis.exceptions.DataError(f"invalid input of type bool: {value!r}")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, float):
        return repr(value).encode()
    raise redis.exceptions.DataError(f"invalid input of type {type(value).__name__}")


def pack_command(args: Sequence[Any]) -> bytes:
    """One command as a RESP array of bulk strings (values encoded as redis-py does).

    hiredis packs the usual kinds (str, bytes, int, float) in C, 2.5 times as fast as
    the loop below (a push's four commands: 8 µs of its CPU); what it refuses (a bool,
    None, a bytearray) goes through the loop, which gives redis-py's answer."""
    try:
        return _hiredis_pack(args if type(args) is tuple else tuple(args))
    except TypeError:
        return _pack(args)


def _pack(args: Sequence[Any]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    append = parts.append
    for value in args:
        kind = type(value)  # the usual kinds inline: this runs once per argument
        if kind is str:
            data = value.encode()
        elif kind is bytes:
            data = value
        elif kind is int:
            data = b"%d" % value
        else:
            data = _arg(value)
        append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class AutoPipeline:
    """`execute(*args)`: as `Redis.execute_command`, for commands without response
    callbacks (scripts, hash reads: their raw replies are what redis-py returns)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._raw = RespBulkReader(client)
        self._pending: list[tuple[bytes, asyncio.Future[Any]]] = []
        self._scheduled = False
        self._sending = Background("a pipelined round trip", log)
        self.commands = 0  # sent, for tests and benchmarks
        self.round_trips = 0

    async def execute(self, *args: Any) -> Any:
        return await self.submit(*args)

    def submit(self, *args: Any) -> asyncio.Future[Any]:
        """`execute` without the coroutine: the command is queued now, and the future
        has its reply. Many submitted at once share a round trip, with no task each."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((pack_command(args), future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), MAX_PER_TRIP):
            self._sending.spawn(self._send(pending[start : start + MAX_PER_TRIP]))

    async def _send(self, batch: list[tuple[bytes, asyncio.Future[Any]]]) -> None:
        self.commands += len(batch)
        self.round_trips += 1
        try:
            replies = await self._raw.run(b"".join(p for p, _ in batch), len(batch))
        except asyncio.CancelledError:
            for _, future in batch:
                if not future.done():
                    future.set_exception(redis.exceptions.ConnectionError("Redis client closed"))
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(reply_error(reply))
            else:
                future.set_result(reply)

    async def execute_many(self, calls: Sequence[Sequence[Any]]) -> list[Any]:
        """Many commands of one caller in round trips of their own (MAX_PER_TRIP each),
        as a redis-py pipeline's `execute()`: the replies in order, or, once all are
        read, the first error reply raised (NOSCRIPT as NoScriptError)."""
        replies: list[Any] = []
        for start in range(0, len(calls), MAX_PER_TRIP):
            chunk = calls[start : start + MAX_PER_TRIP]
            self.commands += len(chunk)
            self.round_trips += 1
            payload = b"".join([pack_command(args) for args in chunk])
            replies += await self._raw.run(payload, len(chunk))
        for reply in replies:
            if isinstance(reply, hiredis.ReplyError):
                raise reply_error(reply)
        return replies

    async def aclose(self) -> None:
        """Wait for the round trips in flight (their callers get their replies)."""
        await self._sending.drain()


def auto_pipeline_for(redis: RedisClient) -> AutoPipeline | None:
    """An auto-pipeline for a standalone client; None for a cluster client (or a test's
    wrapper), whose callers keep the client's own commands."""
    if isinstance(redis, aioredis.Redis):
        return AutoPipeline(redis)
    return None
