"""Many single-key read commands in one round trip, every reply parsed in one go.

redis-py's pipeline spends about 13 µs per command on a 1000-command look-up (an
`asyncio.timeout` per reply, packing each command through its encoder), several
times what Redis itself needs. Here the commands are packed as one RESP buffer, sent
on a connection borrowed from the client's own pool, so connecting, AUTH, TLS, SELECT,
HELLO, health checks and retries stay redis-py's job, and the replies are read from the
socket's stream and parsed by one `hiredis.Reader` under a single timeout.

The redis-py internals used are the connection's `_reader` (the socket's
`asyncio.StreamReader`, which redis-py's own parsers read from), which `_stream()` alone
touches, and its parsers' table of error replies (`reply_error`);
tests/integration/test_bulk_read.py fails loudly if redis-py changes either. A
connection is only given back to the pool when every reply was read; after an error or a
cancellation it is disconnected first, so the pool never hands out a socket with unread
replies.

Standalone Redis only: a Redis Cluster client routes each key to its node, so callers
keep redis-py's pipeline for it (see `router.routes.reads`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
import redis.exceptions
from redis._parsers import BaseParser
from redis.asyncio.connection import AbstractConnection

__all__ = ["ReplyCollector", "RespBulkReader", "pack_commands", "reply_error"]

READ_SIZE = 1 << 16


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
    reply has been read. `round_trips` counts the requests sent, for tests and benchmarks.
    """

    def __init__(self, client: aioredis.Redis) -> None:
        self._pool = client.connection_pool
        self.round_trips = 0

    async def read(self, command: str, keys: Sequence[str], prefix: str = "") -> list[Any]:
        """One reply per key (`prefix` + key), from one write and one read loop."""
        if not keys:
            return []
        replies = await self.run(pack_commands(command, keys, prefix), len(keys))
        for reply in replies:
            if isinstance(reply, hiredis.ReplyError):
                raise reply_error(reply)
        return replies

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
