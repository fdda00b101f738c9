"""`ImrouteClient`: one user's connection to imroute, as an async iterator of pushes.

Guarantees, given what the server sends:
- a msg_id is handed to the app at most once within the last `dedupe_window` ids;
- the position saved is the one of the last push the app has finished with (the one
  before the current `__anext__` call), so a push is never skipped on a resume;
- delivery is at least once: a push no ack covered is sent again on the next connect,
  and dropped there by the dedupe window, which spans connections;
- with `auto_ack`, a push is acked once the app is done with it (when it asks for the
  next one, as for the position); an ack only names the connection the push came on, and
  at most one ack frame leaves per `ack_interval_s`, the latest within it;
- besides acks the client sends only the WebSocket protocol's own pings and pongs (the
  gateway pings every client and closes those silent a whole round; the `websockets`
  library answers). The client's own pings (`ping_interval_s`) find a connection cut
  without a close.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from types import TracebackType

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.typing import Subprotocol

from imroute_client.acks import ClientAcks
from imroute_client.backoff import Backoff, retry_after
from imroute_client.dedupe import DedupeWindow
from imroute_client.dispatch import Target, ask_dispatch
from imroute_client.errors import ClientError, ProtocolError, Unauthorized
from imroute_client.frames import Message, Reconnect, Recovered, parse_frame
from imroute_client.logs import RedactedLog
from imroute_client.policy import (
    CLOSE_DRAIN,
    Outcome,
    RetryState,
    Step,
    classify,
    classify_status,
    refusal_detail,
)
from imroute_client.policy import next_step as plan_next
from imroute_client.stats import ClientStats
from imroute_client.store import MemoryPosStore, PosStore
from imroute_client.urls import resume_url, token_subprotocols

__all__ = ["ImrouteClient", "OnIncomplete"]

log = logging.getLogger("imroute_client")
# The library's own logger, whose DEBUG lines would show the token's subprotocol.
_LIB_LOG = RedactedLog()

OnIncomplete = Callable[[Recovered], Awaitable[None] | None]


class ImrouteClient:
    """An async context manager and an async iterator of `Message`s.

    It connects on the first `__anext__` (or `connect()`), reconnects by itself, and
    raises `Unauthorized` for a refused token. `last_recovery` holds the last
    `recovered` frame; `on_incomplete` (sync or async) is called with each one whose
    `complete` is False, before the next message is handed over. With `auto_ack` off
    the app acks with `await client.ack(message)`; the client then never acks itself,
    and the position it saves is the one of the app's last ack.
    """

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        pos_store: PosStore | None = None,
        retries_same: int = 2,
        backoff_min_s: float = 0.1,
        backoff_max_s: float = 5.0,
        stable_s: float = 5.0,
        dedupe_window: int = 10_000,
        on_incomplete: OnIncomplete | None = None,
        zone: str | None = None,
        http: httpx.AsyncClient | None = None,
        open_timeout_s: float = 10.0,
        ping_interval_s: float | None = 20.0,
        ping_timeout_s: float | None = 20.0,
        rand: Callable[[], float] = random.random,
        auto_ack: bool = True,
        ack_interval_s: float = 0.1,
    ) -> None:
        if retries_same < 0:
            raise ValueError(f"retries_same {retries_same} is negative")
        self.api_url = api_url
        self._token = token
        self.pos_store: PosStore = pos_store if pos_store is not None else MemoryPosStore()
        self.retries_same = retries_same
        self.backoff = Backoff(backoff_min_s, backoff_max_s)
        self.stable_s = stable_s
        self.on_incomplete = on_incomplete
        self.zone = zone
        self.open_timeout_s = open_timeout_s
        self.ping_interval_s = ping_interval_s
        self.ping_timeout_s = ping_timeout_s
        self._rand = rand
        self.auto_ack = auto_ack
        self._http = http  # the app's, when given: the client never closes it
        self._own_http: httpx.AsyncClient | None = None
        self._dedupe = DedupeWindow(dedupe_window)
        self._retry = RetryState()
        self._step: Step | None = None  # what to do before the next connect
        self._target: Target | None = None
        # The gateway its last connect failed on (a transport error): named to dispatch
        # as `avoid`, so that it is sent elsewhere and the fleet learns of it.
        self._failed_on: str | None = None
        self._ws: ClientConnection | None = None
        self._opened_at = 0.0
        self._told = False  # this connection got a reconnect frame
        self._held: Message | None = None  # the message the app holds
        self._fatal: ClientError | None = None
        self._closed = False
        self.pos: str | None = None  # the last position saved
        self.gateway_id: str | None = None  # where it is connected now
        self.last_recovery: Recovered | None = None
        self.stats = ClientStats()
        self._acks = ClientAcks(auto_ack, ack_interval_s, self.stats)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> ImrouteClient:
        if self._http is None:
            self._own_http = self._http = httpx.AsyncClient(timeout=10.0)
        self.pos = await self.pos_store.load()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        if exc_type is None:
            await self._commit()  # the app left the loop normally: it is done with it
        await self.aclose()

    async def aclose(self) -> None:
        """Send the pending ack, close the connection (1000) and the client's own HTTP
        client; iteration ends."""
        self._closed = True
        ws, self._ws, self.gateway_id = self._ws, None, None
        await self._acks.lost(flush=ws is not None)
        if ws is not None:
            await ws.close()
        if self._own_http is not None:
            await self._own_http.aclose()
            self._own_http = None

    def __aiter__(self) -> ImrouteClient:
        return self

    async def __anext__(self) -> Message:
        await self._commit()  # the app asks for the next one: it is done with the last
        while True:
            ws = await self._connected()
            if ws is None:
                raise StopAsyncIteration
            try:
                data = await ws.recv()
            except ConnectionClosed as exc:
                if self._closed:
                    raise StopAsyncIteration from None
                await self._lost(exc.rcvd.code if exc.rcvd is not None else None,
                                 exc.rcvd.reason if exc.rcvd is not None else "")  # fmt: skip
                continue
            msg = await self._on_data(data)
            if msg is not None:
                return msg

    async def connect(self) -> None:
        """Be connected now (dispatch, backoff and retries as needed); the iterator
        connects by itself, so this is only for apps that want to know when it is."""
        await self._connected()

    async def ack(self, message: Message) -> None:
        """Acknowledge `message` and every one before it on its connection (cumulative;
        paced like the client's own acks). A message whose connection has ended is acked
        if the server sent it again on this one (the dedupe window dropped the copy);
        else when it comes again."""
        pos = self._acks.ack(message)
        if pos is not None:
            await self._save(pos)  # auto_ack off: a resume's `since` acks what it covers

    # ------------------------------------------------------------------ connecting

    async def _connected(self) -> ClientConnection | None:
        while self._ws is None:
            if self._fatal is not None:
                raise self._fatal
            if self._closed:
                return None
            if self._http is None:
                raise RuntimeError("use ImrouteClient as `async with ImrouteClient(...)`")
            step, self._step = self._step, None
            if step is not None and step.delay_s > 0:
                await asyncio.sleep(step.delay_s)
            if self._target is None or step is None or step.dispatch:
                self._target = await self._dispatch(self._http)
            else:
                self.stats.same_retries += 1
            # The token in a subprotocol, not in the URL, which proxies log.
            url = resume_url(self._target.ws_url, self.pos)
            try:
                ws = await connect(
                    url,
                    subprotocols=[Subprotocol(p) for p in token_subprotocols(self._token)],
                    open_timeout=self.open_timeout_s,
                    ping_interval=self.ping_interval_s,
                    ping_timeout=self.ping_timeout_s,
                    logger=_LIB_LOG,
                )
            except InvalidStatus as exc:
                self._failed_on = None  # it answered: reachable
                self._refused(exc)
                continue
            except (OSError, TimeoutError, WebSocketException) as exc:
                log.info("connecting to %s failed: %r", self._target.gateway_id, exc)
                self.stats.transport_errors += 1
                self._failed_on = self._target.gateway_id
                self._step = self._plan(Outcome.TRANSPORT, 0.0)
                continue
            self._failed_on = None
            if self._closed:  # aclose() ran meanwhile
                await ws.close()
                return None
            self._ws, self._told = ws, False
            self._opened_at = asyncio.get_running_loop().time()
            self.gateway_id = self._target.gateway_id
            self.stats.connects += 1
            self._acks.connected(ws, self.stats.connects)
        return self._ws

    async def _dispatch(self, http: httpx.AsyncClient) -> Target:
        """The next gateway; after failed connects (`retries_same` + 1 of them), not the
        one they failed on unless it is the only one dispatch has."""
        avoid, self._failed_on = self._failed_on, None
        try:
            target = await ask_dispatch(
                http, self.api_url, self._token, zone=self.zone, backoff=self.backoff,
                rand=self._rand, errors=self.stats.dispatch_errors, avoid=avoid,
            )  # fmt: skip
        except ClientError as exc:
            self._fatal = exc
            raise
        self.stats.dispatches += 1
        self.stats.avoided += avoid is not None
        return target

    async def _lost(self, code: int | None, reason: str) -> None:
        """The connection ended (`code` None: without a close frame): plan the next."""
        self._ws, self.gateway_id = None, None
        await self._acks.lost(flush=False)  # they name nothing on the next
        lived = asyncio.get_running_loop().time() - self._opened_at
        outcome = classify(code, self._told, reason)
        if outcome is Outcome.USER_CAP:
            self.stats.user_cap += 1
            log.warning("the gateway refused this connection: %s", reason)
        self.stats.moves += code == CLOSE_DRAIN or self._told
        self.stats.transport_errors += outcome is Outcome.TRANSPORT
        log.info("connection to %s ended (%s, close %s)", self._target, outcome.value, code)
        self._step = self._plan(outcome, lived)

    def _refused(self, exc: InvalidStatus) -> None:
        """The gateway answered the handshake with HTTP, not 101: 401 is final, 429 and
        503 (over a connect rate, full, draining) go elsewhere, after Retry-After."""
        response = exc.response
        status = response.status_code
        outcome = classify_status(status)
        detail = refusal_detail(bytes(response.body))
        if outcome is Outcome.UNAUTHORIZED:
            self._fatal = Unauthorized(f"the gateway refused the token (HTTP 401: {detail})")
            raise self._fatal
        assert self._target is not None
        log.info("%s refused the connection (HTTP %d: %s)", self._target.gateway_id, status,
                 detail)  # fmt: skip
        self.stats.refused += outcome is Outcome.MOVE
        step = self._plan(outcome, 0.0)
        wait = retry_after(response.headers.get("Retry-After"), self.backoff, self._rand)
        self._step = step if wait is None else Step(step.dispatch, max(step.delay_s, wait))

    def _plan(self, outcome: Outcome, lived_s: float) -> Step:
        return plan_next(
            self._retry, outcome, lived_s, retries_same=self.retries_same,
            backoff=self.backoff, stable_s=self.stable_s, rand=self._rand,
        )  # fmt: skip

    # ------------------------------------------------------------------ frames

    async def _on_data(self, data: str | bytes) -> Message | None:
        try:
            frame = parse_frame(data)
        except ProtocolError as exc:
            log.warning("skipping a frame: %s", exc)
            self.stats.bad_frames += 1
            return None
        if isinstance(frame, Message):
            if self._dedupe.seen(frame.msg_id):
                self.stats.duplicates += 1
                pos = self._acks.duplicate(frame)
                if pos is not None:
                    await self._save(pos)  # nothing before it is held: it is processed
                return None
            frame = self._acks.push(frame)
            if self.auto_ack:
                self._held = frame
            self.stats.messages += 1
            return frame
        if isinstance(frame, Reconnect):
            # Keep reading until the gateway's close (4503): it spreads the closes over
            # its drain window, and pushes keep coming until then.
            self._told = True
            self.stats.told += 1
        elif isinstance(frame, Recovered):
            self.last_recovery = frame
            if not frame.complete:
                self.stats.incomplete += 1
                if self.on_incomplete is not None:
                    result = self.on_incomplete(frame)
                    if inspect.isawaitable(result):
                        await result
        return None

    async def _commit(self) -> None:
        held, self._held = self._held, None  # with auto_ack only
        if held is not None:
            if held.pos is not None:
                await self._save(held.pos)
            await self.ack(held)

    async def _save(self, pos: str) -> None:
        self.pos = pos
        await self.pos_store.save(pos)
