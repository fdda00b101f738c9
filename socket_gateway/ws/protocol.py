"""The WebSocket protocol as the gateway speaks it, sans I/O: close codes, limits, wire
bytes, deadlines, and what a client's text message calls for.

Nothing here touches a transport, a socket or the event loop: these are decisions on
bytes, used by the connection (`socket_gateway.ws.conn`) and its endpoint.
"""

from __future__ import annotations

import email.utils
import http
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from websockets.datastructures import Headers
from websockets.http11 import Response
from websockets.typing import Subprotocol

from shared.errors import InvalidInput
from shared.http_answers import refusal_body
from shared.wire import parse_client_frame

__all__ = [
    "CLOSE_FULL",
    "CLOSE_GOING_AWAY",
    "CLOSE_INTERNAL",
    "CLOSE_INVALID_DATA",
    "CLOSE_POLICY",
    "CLOSE_TRY_AGAIN",
    "CLOSE_UNSUPPORTED",
    "MAX_CLIENT_FRAME",
    "PING_FRAME",
    "SUBPROTOCOL",
    "TOKEN_SUBPROTOCOL_PREFIX",
    "USER_CAP_REASON",
    "QuietLog",
    "WsTimers",
    "client_text",
    "close_reason",
    "json_refusal",
    "select_subprotocol",
    "token_of",
    "user_cap_reason",
]

CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003
CLOSE_INVALID_DATA = 1007
CLOSE_POLICY = 1008
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013
# A user at IMROUTE_MAX_CONNECTIONS_PER_USER, right after the 101 (a full gateway is
# refused before it, HTTP 503): another gateway would refuse too, which the reason says.
CLOSE_FULL = 4429
USER_CAP_REASON = "too many connections for this user"
# Clients only send pings and acks; anything bigger is junk and gets 1009 from the library.
MAX_CLIENT_FRAME = 4096
# (The request head's own limits: HandshakeLimits.head, IMROUTE_HTTP_MAX_HEAD_BYTES &c.)

# A browser cannot set headers on a WebSocket: it sends its token as a subprotocol,
# `imroute.jwt.<token>`, next to SUBPROTOCOL, which is the one the gateway selects (a
# browser fails a connection that offered subprotocols and got none back, and the
# token must not be echoed).
SUBPROTOCOL = "imroute.v1"
TOKEN_SUBPROTOCOL_PREFIX = "imroute.jwt."

# An unmasked ping with an empty payload, as ServerProtocol.send_ping(b"") would write it
# (no extensions are ever negotiated, so the bytes are always these).
PING_FRAME = b"\x89\x00"


@dataclass(frozen=True, slots=True)
class WsTimers:
    """The endpoint's deadlines, injected so tests (and operators) can shorten them."""

    handshake_s: float = 3.0  # TCP accept -> request head answered (IMROUTE_WS_HANDSHAKE_TIMEOUT_S)
    close_s: float = 10.0  # close frame sent -> TCP closed by the client
    ping_interval_s: float = 30.0  # gateway-wide keepalive round; silent a whole round -> 1011
    shutdown_s: float = 5.0  # close(close_connections=True) -> remaining ones are aborted


def client_text(data: bytes | bytearray | memoryview) -> tuple[int, str] | str | None:
    """A client's whole text message: None for a ping (answer pong), a str for an ack
    (its `pos`; empty when malformed), else the close code and reason."""
    try:
        text = bytes(data).decode()
    except UnicodeDecodeError:
        return CLOSE_INVALID_DATA, "text frames must be UTF-8"
    try:
        return parse_client_frame(text)
    except InvalidInput as exc:
        return CLOSE_POLICY, close_reason(exc.message)


def user_cap_reason(limit: int) -> str:
    """The 4429 reason for a user at the per-user cap (it names the cap)."""
    return f"{USER_CAP_REASON} (at most {limit}, IMROUTE_MAX_CONNECTIONS_PER_USER)"


def close_reason(text: str) -> str:
    """Close reasons are limited to 123 bytes."""
    return text.encode()[:120].decode(errors="ignore")


def select_subprotocol(_: object, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """`ServerProtocol(select_subprotocol=...)`: SUBPROTOCOL when offered, else none
    (a client that offers other subprotocols only is still served, as before)."""
    return Subprotocol(SUBPROTOCOL) if SUBPROTOCOL in offered else None


def token_of(query: Mapping[str, list[str]], offered: Sequence[str]) -> str | None:
    """The client's token: from an `imroute.jwt.<token>` subprotocol, else `?token=`."""
    for value in offered:
        if value.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return value[len(TOKEN_SUBPROTOCOL_PREFIX) :]
    tokens = query.get("token")
    return tokens[0] if tokens else None


def json_refusal(
    status: int, error: str, detail: str, retry_after_s: int | None = None
) -> Response:
    """An HTTP answer to a handshake that gets no 101: `{"error","detail"}`, closed after."""
    body = refusal_body(error, detail)
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Length", str(len(body))),
            ("Content-Type", "application/json"),
        ]
    )
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return Response(status, http.HTTPStatus(status).phrase, headers, body)


class QuietLog(logging.LoggerAdapter[logging.Logger]):
    """The `websockets` logger for handshakes: warnings and errors only.

    At DEBUG the library logs the request line and every header, which hold the client's
    token; at INFO one line per connection opened or refused, which a flood turns into a
    flood of log lines. Refusals are counted and logged, rate-limited, by the endpoint.
    """

    def isEnabledFor(self, level: int) -> bool:
        return level >= logging.WARNING and self.logger.isEnabledFor(level)
