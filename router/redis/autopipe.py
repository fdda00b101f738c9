"""Raw RESP on a pooled connection of a standalone client: many commands packed into one
request, every reply parsed by hiredis in one go. One caller's many reads take the bulk
reader (`RespBulkReader`); many tasks' single commands, the auto-pipeline
(`AutoPipeline`), which sends each round trip through the bulk reader's `run`.

**The bulk reader.** redis-py's pipeline spends about 13 µs per command on a
1000-command look-up (an `asyncio.timeout` per reply, packing each command through its
encoder), several times what Redis itself needs. Here the commands are packed as one
RESP buffer, sent on a connection borrowed from the client's own pool, so connecting,
AUTH, TLS, SELECT, HELLO, health checks and retries stay redis-py's job, and the
replies are read from the socket's stream and parsed by one `hiredis.Reader` under a
single timeout.

The redis-py internals used are the connection's `_reader` (the socket's
`asyncio.StreamReader`, which redis-py's own parsers read from), which `_stream()` alone
touches, and its parsers' table of error replies (`reply_error`);
tests/integration/test_bulk_read.py fails loudly if redis-py changes either. A
connection is only given back to the pool when every reply was read; after an error or a
cancellation it is disconnected first, so the pool never hands out a socket with unread
replies.

**The auto-pipeline.** Each P2P push makes a few single commands (its recipients'
routes, the log-and-inbox script, the receipt script), and at hundreds of pushes a
second redis-py spends more CPU on each command's round trip (a pooled connection taken
and given back, a retry wrapper, a timeout, a write and a read) than on the command.
Here every command issued during one turn of the event loop is packed into one RESP
buffer and sent on one pooled connection, and each caller gets its own reply, or its
own error: an error reply (raised as redis-py's class for it: NOSCRIPT as NoScriptError,
so script runners load and retry as before, READONLY as ReadOnlyError) fails only its
own command. Commands keep their order within a round trip, and each round trip runs as
soon as its tick ends, so no command waits for another's reply.

Standalone Redis only: a Redis Cluster client routes each key to its node, so callers
keep redis-py's pipeline for reads (`router.routes.registry`) and the client for single
commands (`auto_pipeline_for` gives None for it). Replies are decoded as UTF-8, as the
clients here do (`decode_responses=True`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
import redis.exceptions
from redis._parsers import BaseParser
from redis.asyncio.connection import AbstractConnection

from router.redis.client import RedisClient
from shared.tasks import Background

__all__ = [
    "AutoPipeline",
    "ReplyCollector",
    "RespBulkReader",
    "auto_pipeline_for",
    "pack_command",
    "pack_commands",
    "reply_error",
]

log = logging.getLogger(__name__)

MAX_PER_TRIP = 1000  # commands packed into one request, at most
READ_SIZE = 1 << 16
_hiredis_pack: Callable[[tuple[Any, ...]], bytes] = hiredis.pack_command


def pack_commands(command: str, keys: Sequence[str], prefix: str = "") -> bytes:
    """`command prefix+key` for each key, as one RESP request buffer."""
    head = f"*2\r\n${len(command)}\r\n{command}\r\n"
    # One str built and encoded at once is about twice as fast as per-key bytes, but a
    # bulk length counts bytes, so that only holds when every character is one byte.
    # The prefix goes in here, so no key string is built on its own.
    n = len(prefix)
    text = "".join([f"{head}${n + len(key)}\r\n{prefix}{key}\r\n" for key in keys])
    if text.isascii():
        return text.encode()
    encoded = [(prefix + key).encode() for key in keys]
    bhead = head.encode()
    return b"".join([b"%s$%d\r\n%s\r\n" % (bhead, len(key), key) for key in encoded])


def reply_error(reply: hiredis.ReplyError) -> redis.exceptions.RedisError:
    """An error reply as redis-py raises it, its whole text kept: READONLY as
    ReadOnlyError, NOSCRIPT as NoScriptError, LOADING as BusyLoadingError and so on
    (redis-py's own table), any other as ResponseError. Which of them are worth another
    try is `router.redis.errors`' call, and needs the class."""
    text = str(reply)
    parsed: redis.exceptions.RedisError = BaseParser.parse_error(text)  # type: ignore[no-untyped-call]
    try:
        return type(parsed)(text)
    except Exception:  # MOVED's and ASK's read their text as "slot host:port"
        return parsed


class RespBulkReader:
    """Runs `command key` for many keys over one pooled connection of a standalone client.

    Replies are decoded as UTF-8 whatever the client's `decode_responses`, and come back
    in the keys' order; an error reply raises as redis-py would (`reply_error`) once every
    reply has been read (`read`), or stands in its key's place (`read_each`).
    `round_trips` counts the requests sent, for tests and benchmarks.
    """

    def __init__(self, client: aioredis.Redis) -> None:
        self._pool = client.connection_pool
        self.round_trips = 0

    async def read(self, command: str, keys: Sequence[str], prefix: str = "") -> list[Any]:
        """One reply per key (`prefix` + key), from one write and one read loop."""
        replies = await self.read_each(command, keys, prefix)
        for reply in replies:
            if isinstance(reply, redis.exceptions.RedisError):
                raise reply
        return replies

    async def read_each(self, command: str, keys: Sequence[str], prefix: str = "") -> list[Any]:
        """`read`, an error reply in its key's place as redis-py would raise it."""
        if not keys:
            return []
        replies = await self.run(pack_commands(command, keys, prefix), len(keys))
        return [reply_error(r) if isinstance(r, hiredis.ReplyError) else r for r in replies]

    async def run(self, payload: bytes, count: int) -> list[Any]:
        """The `count` replies to the packed commands `payload`, error replies among them
        as `hiredis.ReplyError` objects, not raised (each is its own command's)."""
        conn: AbstractConnection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        in_sync = False
        replies: list[Any]
        try:
            replies, in_sync = await conn.retry.call_with_retry(
                lambda: self._round_trip(conn, payload, count),
                lambda _error: conn.disconnect(nowait=True),
            )
        finally:
            if not in_sync:
                # An error, a timeout, a cancellation or stray data: replies may still be
                # on their way, and the next user of this socket would read them.
                await conn.disconnect(nowait=True)
            await self._pool.release(conn)
        return replies

    async def _round_trip(
        self, conn: AbstractConnection, payload: bytes, count: int
    ) -> tuple[list[Any], bool]:
        """Send `payload`, read `count` replies; True when nothing else was on the wire."""
        await conn.send_packed_command(payload)  # connects, health-checks, maps write errors
        self.round_trips += 1
        stream = _stream(conn)
        replies = ReplyCollector(count)
        try:
            async with asyncio.timeout(conn.socket_timeout):
                while not replies.complete:
                    data = await stream.read(READ_SIZE)
                    if not data:
                        raise redis.exceptions.ConnectionError("Redis closed the connection")
                    replies.feed(data)
        except TimeoutError:
            raise redis.exceptions.TimeoutError("Timeout reading from Redis") from None
        except OSError as exc:
            raise redis.exceptions.ConnectionError(f"Error reading from Redis: {exc}") from exc
        except hiredis.ProtocolError as exc:
            raise redis.exceptions.ConnectionError(f"Protocol error from Redis: {exc}") from exc
        return replies.replies, replies.in_sync


class ReplyCollector:
    """The pure core of a bulk read: bytes in, `count` parsed replies out (UTF-8 text).

    `in_sync` turns False when the bytes held more than the replies: RESP3 push data
    (we subscribe to nothing, so it is not ours to consume) or bytes past the last reply.
    Either way the connection must not go back to the pool as it is.
    """

    def __init__(self, count: int) -> None:
        self._count = count
        self._reader = hiredis.Reader(encoding="utf-8")
        self.replies: list[Any] = []
        self._pushed = False

    @property
    def complete(self) -> bool:
        return len(self.replies) >= self._count

    @property
    def in_sync(self) -> bool:
        return not self._pushed and not self._reader.has_data()

    def feed(self, data: bytes) -> None:
        """Parse `data`; raises hiredis.ProtocolError on bytes that are not RESP."""
        self._reader.feed(data)
        gets, push, replies = self._reader.gets, hiredis.PushNotification, self.replies
        reply = gets()
        while reply is not False:
            if type(reply) is push:
                self._pushed = True
            else:
                replies.append(reply)
            reply = gets()


def _stream(conn: AbstractConnection) -> asyncio.StreamReader:
    """The connection's socket stream: redis-py internals, kept to this one function."""
    stream = conn._reader
    if not isinstance(stream, asyncio.StreamReader):
        raise redis.exceptions.ConnectionError(
            f"redis-py connection has no stream reader (got {type(stream).__name__})"
        )
    return stream


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
