"""The opening handshake of a client connection, and what follows it until routed.

The HTTP request is parsed and answered by a short-lived `ServerProtocol` that is
dropped after the 101, so the request and its headers are not kept for the life of the
connection. Everything a client can be refused for is decided before the 101, and
answered with HTTP and a JSON body: a request head over its limits (431, 414: at most
IMROUTE_HTTP_MAX_HEAD_BYTES of it is kept), the per-IP connect rate (429, answered at
the accept, before the request), a draining gateway or a full one (503, both with
Retry-After), the token (401). A refused socket is closed as soon as its answer is
written. Until then it is counted, from its accept, under its address
(`socket_gateway.preauth.PreAuthPool`). After the 101 the client goes into the local map,
then its route into the registry (close 1013 when the registry is unavailable, 4429
when its user is at the per-user cap: the check is the route write itself).
"""

from __future__ import annotations

import asyncio
import logging
import math
from urllib.parse import parse_qs, urlsplit

from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders
from websockets.headers import parse_subprotocol
from websockets.http11 import Request, Response
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from shared.auth import verify_token
from shared.errors import AuthError, RegistryUnavailable, TooManyConnections
from shared.http_heads import HeadRefusal, gather_head
from socket_gateway.connections import ClientConn
from socket_gateway.preauth import client_key
from socket_gateway.ws.admission import ConnectRate, request_line_ok
from socket_gateway.ws.framing import FrameConn
from socket_gateway.ws.protocol import (
    CLOSE_FULL,
    CLOSE_INTERNAL,
    CLOSE_TRY_AGAIN,
    MAX_CLIENT_FRAME,
    QuietLog,
    json_refusal,
    select_subprotocol,
    token_of,
    user_cap_reason,
)

__all__ = ["RETRY_AFTER_S", "HandshakeConn"]

log = logging.getLogger(__name__)

# Retry-After of a 503: about one fleet heartbeat, after which dispatch knows the
# gateway is full or draining and names another.
RETRY_AFTER_S = 2

# Never DEBUG (the request line and headers hold the token), nor a line per connection.
_LIB_LOG = QuietLog(logging.getLogger("websockets.server"))

# Headers of the library's own refusals that the JSON version keeps.
_KEPT_HEADERS = ("Upgrade", "Allow")


def _handshake_protocol() -> ServerProtocol:
    return ServerProtocol(
        select_subprotocol=select_subprotocol, max_size=MAX_CLIENT_FRAME, logger=_LIB_LOG
    )


class HandshakeConn(FrameConn):
    """The connection layer from the first byte to a registered route."""

    __slots__ = ()

    def _pre_auth(self) -> bool:
        """A socket just accepted: its connect taken from its address's rate, then
        counted among those without a 101 under its address, or refused (False: to be
        aborted) when its address holds IMROUTE_WS_MAX_PRE_AUTH_PER_IP of them, or when
        all IMROUTE_WS_MAX_PRE_AUTH places are taken and its address holds the most.
        Otherwise, with every place taken, the address holding the most loses its oldest.
        Over the rate, it is answered 429 at once, in a free place: one over the rate
        never takes another's, so with every place taken it is refused too."""
        ep = self._ep
        t = self._transport
        assert t is not None
        now = ep._clock.monotonic()
        key = client_key(t.get_extra_info("peername"))
        rate = ep.connect_rate
        wait = rate.take(key, now) if rate is not None and key is not None else 0.0
        pool = ep._pending
        where = key or "?"
        kind = pool.refusal(where)
        if kind is not None:
            ep.refusals.note(kind, now, f"{pool.held(where)} open from {where}, {len(pool)} in all")
            return False
        if wait > 0 and pool.full:
            ep.refusals.note("rate_limited", now, f"from {where}, every place taken")
            return False
        evicted = pool.add(self, where)
        if evicted is not None:
            victim, holder = evicted
            ep.refusals.note("pre_auth_evicted", now, f"the oldest of {holder}'s")
            victim.abort()
        if wait > 0:
            assert rate is not None
            self._rate_limited(rate, where, wait, now)
        return True

    def _rate_limited(self, rate: ConnectRate, key: str, wait: float, now: float) -> None:
        """Answer 429 before the request, then FIN; what the client sends is read and
        dropped (closing with it unread would reset the connection, and could lose the
        answer) until it closes, or the request line's deadline cuts it."""
        self._ep.refusals.note("rate_limited", now, f"from {key}")
        self._head = None
        refusal = json_refusal(
            429,
            "rate_limited",
            f"over {rate.rate_per_s:g} connects/s from this address "
            "(IMROUTE_WS_CONNECT_RATE_PER_IP)",
            retry_after_s=max(1, math.ceil(wait)),
        )
        self._write_out([refusal.serialize(), b""])

    def _line_in(self) -> None:
        """The request line is in: the head's deadline (IMROUTE_WS_HANDSHAKE_TIMEOUT_S
        from the accept) replaces the request line's."""
        ep = self._ep
        extra = ep.timers.handshake_s - ep.limits.request_line_s
        timer = self._timer
        if extra > 0 and timer is not None:
            timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(timer.when() + extra, self._expire)

    def _on_head(self, data: bytes) -> None:
        """Bytes before the 101: gather the request head within its limits (at most
        IMROUTE_HTTP_MAX_HEAD_BYTES are kept), then answer it. Only a request line earns
        the rest of the head's deadline: any other first line of a head still coming is
        answered 400 at once (a whole head is the parser's to judge)."""
        head = self._head
        if head is None:  # handshake refused, the response is on its way: ignore the rest
            return
        line_in = b"\n" in data and b"\n" not in head
        gathered = gather_head(head, data, self._ep.limits.head)
        if gathered is None:
            if line_in:
                line = head[: head.index(b"\n") + 1]
                if not request_line_ok(line):
                    self._head = None
                    self._refuse_line(line)
                    return
                self._line_in()
            return
        self._head = None
        if isinstance(gathered, HeadRefusal):
            self._refuse_head(gathered)
            return
        self._handshake(*gathered)

    def _refuse_line(self, line: bytes | bytearray) -> None:
        ep = self._ep
        shown = bytes(line[:40]).decode("ascii", "replace").rstrip("\r\n")
        ep.refusals.note("bad_request", ep._clock.monotonic(), f"a first line of {len(line)} B")
        hs = _handshake_protocol()
        hs.send_response(
            json_refusal(
                400,
                "bad_handshake",
                f"the first line is not a request line (GET <target> HTTP/1.1): {shown!r}",
            )
        )
        self._send_handshake(hs)

    def _refuse_head(self, refusal: HeadRefusal) -> None:
        """A head over a limit (ours, or the library's own): its JSON answer, counted."""
        ep = self._ep
        ep.refusals.note(refusal.error, ep._clock.monotonic(), refusal.detail)
        hs = _handshake_protocol()
        hs.send_response(json_refusal(refusal.status, refusal.error, refusal.detail))
        self._send_handshake(hs)

    def _handshake(self, head: bytes, rest: bytes) -> None:
        ep = self._ep
        hs = _handshake_protocol()
        hs.receive_data(head)
        events = hs.events_received()
        request = events[0] if events else None
        if not isinstance(request, Request):
            refusal = _library_refusal(hs.handshake_exc)
            if refusal is not None:
                self._refuse_head(refusal)
                return
            # Not a valid HTTP request: the library wrote an error response or an EOF.
            ep.refusals.note("bad_request", ep._clock.monotonic(), "not an HTTP request")
            self._send_handshake(hs)
            return
        url = urlsplit(request.path)
        query = parse_qs(url.query)
        admitted: str | None = None
        if url.path != "/ws":  # /metrics is on the internal port (metrics_http)
            response = json_refusal(404, "not_found", "the WebSocket endpoint is /ws?token=<JWT>")
        else:
            # The library checks the upgrade (and picks the subprotocol) first: a request
            # that is no WebSocket handshake gets its 4xx whatever its token.
            response = hs.accept(request)
            if response.status_code != 101:
                response = _as_json(response)
            else:
                decided = self._admit(request, query)
                if isinstance(decided, Response):
                    response = decided
                else:
                    admitted = decided
        hs.send_response(response)
        if admitted is None:
            self._send_handshake(hs)
            return
        t = self._transport
        assert t is not None
        for data in hs.data_to_send():
            t.write(data)
        self._disarm()
        ep._pending.discard(self)
        # The frame phase runs on a fresh protocol; the request is not kept.
        ws = ServerProtocol(state=OPEN, max_size=MAX_CLIENT_FRAME)
        self._ws = ws
        self._open = True
        self._alive = True
        since = query["since"][0] if query.get("since") else None
        self._accept(admitted, since)
        if rest:
            self._receive(ws, rest)

    def _admit(self, request: Request, query: dict[str, list[str]]) -> Response | str:
        """The uid of a client that may have its 101, or the HTTP answer refusing it."""
        ep = self._ep
        now = ep._clock.monotonic()
        if not ep.accepting:
            ep.refusals.note("not_accepting", now)
            return json_refusal(
                503,
                "unavailable",
                "gateway is draining or shutting down: ask /v1/dispatch for another",
                retry_after_s=RETRY_AFTER_S,
            )
        offered = [p for v in request.headers.get_all("Sec-WebSocket-Protocol")
                   for p in parse_subprotocol(v)]  # fmt: skip
        try:
            uid = verify_token(ep._secret, token_of(query, offered), ep._clock, ep.token_rules)
        except AuthError as exc:
            ep.refusals.note("unauthorized", now, str(exc))
            return json_refusal(401, "unauthorized", str(exc))
        if ep.max_connections is not None and len(ep._conns) >= ep.max_connections:
            # Refused before anything is registered; dispatch sends clients elsewhere
            # once the fleet record shows it.
            ep.refusals.note("full", now)
            return json_refusal(
                503,
                "gateway_full",
                f"gateway full ({ep.max_connections} connections): ask /v1/dispatch for another",
                retry_after_s=RETRY_AFTER_S,
            )
        return uid

    def _accept(self, uid: str, since: str | None) -> None:
        """An authenticated client: into the local map, then its route into Redis, then
        its replay (from `since`, or its inbox)."""
        ep = self._ep
        conn = ClientConn(uid, ep._conn_ids(), self)
        self._conn = conn
        if ep.resumer is not None:
            ep.resumer.attach(conn)
        # Local map first, then Redis: a route never points at a connection this
        # gateway would report missing.
        ep._conns.add(conn)
        self._registering = True
        ep._spawn(self._register_route(conn, since))

    def _send_handshake(self, hs: ServerProtocol) -> None:
        """Write a refused handshake's answer, then close once it is written: a refused
        socket is not held. The handshake deadline stays armed, for a client that does
        not read its answer."""
        self._write_out(hs.data_to_send())
        t = self._transport
        if t is not None:
            t.close()

    def _expire(self) -> None:
        if self._ws is None and self._head is not None:
            # Still sending its request head (slowloris, or a silent socket).
            self._ep.refusals.note("handshake_timeout", self._ep._clock.monotonic())
        super()._expire()

    async def _register_route(self, conn: ClientConn, since: str | None) -> None:
        ep = self._ep
        try:
            await ep._register(conn.uid, conn.conn_id)
            if ep.resumer is not None and self._open:
                await ep.resumer.resume(conn, since)
        except TooManyConnections as exc:
            self.close(CLOSE_FULL, user_cap_reason(exc.limit))
            if since_logged := ep.limit_counts.user_cap.note(ep._clock.monotonic()):
                log.warning("refused %d connection(s) (4429): %s", since_logged, exc)
        except RegistryUnavailable as exc:
            log.warning("register or replay of %s failed: %s", conn.conn_id, exc)
            self.close(CLOSE_TRY_AGAIN, "route registry unavailable, retry later")
        except Exception:
            log.exception("register %s failed", conn.conn_id)
            self.close(CLOSE_INTERNAL, "internal error")
        finally:
            self._registering = False
            if self._lost and not ep._abandoned:
                ep._spawn(ep._unregister_conn(conn))


def _library_refusal(exc: Exception | None) -> HeadRefusal | None:
    """The library's own limits on a head (8 KiB a line, 128 fields), hit only where
    ours allow more, as the refusal ours would give; it answers them in plain text."""
    if isinstance(exc, RequestLineTooLong):
        return HeadRefusal(414, "uri_too_long", f"the request line is too long ({exc})")
    if isinstance(exc, HeaderLineTooLong | TooManyHeaders):
        return HeadRefusal(431, "headers_too_large", f"the request headers are too large ({exc})")
    return None


def _as_json(response: Response) -> Response:
    """The library's plain-text refusal of a bad handshake, as JSON like ours."""
    detail = bytes(response.body).decode(errors="replace").strip()
    refusal = json_refusal(response.status_code, "bad_handshake", detail)
    for name in _KEPT_HEADERS:
        value = response.headers.get(name)
        if value is not None:
            refusal.headers[name] = value
    return refusal
