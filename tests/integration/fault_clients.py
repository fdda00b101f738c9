"""Helpers of the recovery fault tests (a gateway killed, a gateway drained):
`imroute dev` as real processes, hundreds of SDK clients that keep everything they are
handed, a load that writes down who each push was addressed to, a loopback TCP proxy
that can cut a connection silently, and a raw WebSocket client that resumes by itself
with `since`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from imroute_client import ImrouteClient
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from router.processes.ports import free_port_block
from shared.auth import issue_token
from shared.clock import SystemClock
from tests.integration.procs import BIN, Proc, base_env, read_until, running

__all__ = [
    "CutClient",
    "DevRun",
    "Got",
    "SdkUser",
    "TcpProxy",
    "dev_stack",
    "drain_output",
    "key_of",
]

RESUME_TRIES = 20  # the raw client's reconnects after a cut, RESUME_BACKOFF_S apart
RESUME_BACKOFF_S = 0.25
API_KEY = "fault-test-api-key-0123456789"
SECRET = "fault-test-secret-0123456789abcdef-0123"


def key_of(content: Any) -> str:
    """The name of a push from its content ({"kind": "p2p", "n": 17} -> "p2p:17")."""
    if isinstance(content, dict):
        return f"{content.get('kind')}:{content.get('n')}"
    return f"?:{content!r}"


# ---------------------------------------------------------------------------- the stack


@dataclass
class DevRun:
    proc: Proc
    api_url: str
    secret: str
    api_key: str
    ws_urls: dict[str, str]
    output: list[str] = field(default_factory=list)
    groups: dict[str, str] = field(default_factory=dict)  # gateway id -> its group

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def token(self, uid: str, ttl: int = 3600) -> str:
        return issue_token(self.secret, uid, ttl, SystemClock())


@contextmanager
def dev_stack(
    redis_url: str, prefix: str, tmp_path: Path, gateways: int, groups: int, **env: str
) -> Iterator[DevRun]:
    """`imroute dev --gateways N --groups G` on free loopback ports, with its own key
    prefix and directory; stopped with SIGINT (every child by PID) at the end."""
    port = free_port_block([0, *range(1, gateways + 1), *range(1001, 1001 + gateways)])
    environ = base_env(
        IMROUTE_REDIS_URL=redis_url,
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{tmp_path}/users.db",
        IMROUTE_API_KEY=API_KEY,
        IMROUTE_SECRET=SECRET,
        **env,
    )
    argv = [str(BIN / "imroute"), "dev", "--gateways", str(gateways), "--groups", str(groups),
            "--port", str(port)]  # fmt: skip
    with running(argv, environ) as proc:
        lines = read_until(proc, "Ctrl-C stops everything", timeout=60)
        banner = "\n".join(lines)
        found = re.findall(r"(gw\d+) group=(g\d+) ws=(\S+)", banner)
        assert len(found) == gateways, banner
        ws_urls = {gw: url for gw, _, url in found}
        of_group = {gw: group for gw, group, _ in found}
        stack = DevRun(proc, f"http://127.0.0.1:{port}", SECRET, API_KEY, ws_urls, lines, of_group)
        try:
            yield stack
        finally:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(Exception):
                proc.wait(20)
            drain_output(stack)


def drain_output(stack: DevRun) -> list[str]:
    """Move what `imroute dev` (and its children) printed so far into `stack.output`."""
    lines = stack.proc.lines
    if lines is not None:
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is None:
                lines.put(None)
                break
            stack.output.append(line)
    return stack.output


# ---------------------------------------------------------------------------- clients


@dataclass(frozen=True, slots=True)
class Got:
    """One push as a client got it."""

    msg_id: str
    key: str
    recovered: bool
    at: float  # loop time
    where: str | None = None  # the gateway the client was connected to


class SdkUser:
    """One `ImrouteClient`, read in a task of its own into `got`."""

    def __init__(self, uid: str, client: ImrouteClient) -> None:
        self.uid = uid
        self.client = client
        self.got: list[Got] = []
        self.error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"sdk-{self.uid}")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with self.client as client:
                async for msg in client:
                    self.got.append(
                        Got(msg.msg_id, key_of(msg.content), msg.recovered, loop.time(),
                            client.gateway_id)
                    )  # fmt: skip
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # kept for the assertion
            self.error = exc

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        with contextlib.suppress(Exception):
            await self.client.aclose()


class TcpProxy:
    """A loopback TCP proxy to one port. `cut()` stops forwarding in both directions
    and closes nothing: both ends keep a connection that carries nothing, as across a
    network that silently drops every packet."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.is_cut = False

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [writer, up_writer]
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        if not self.is_cut:
            dst.close()

    def cut(self) -> None:
        """Forward nothing more, either way; every socket stays open."""
        self.is_cut = True
        for task in list(self._pumps):
            task.cancel()

    async def aclose(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.transport.abort()


class CutClient:
    """A raw WebSocket client (no SDK) whose first connection goes through a `TcpProxy`.
    It keeps every push frame it reads and the `pos` of the last one; `cut_and_resume`
    cuts the proxy, waits, aborts its own socket and reconnects directly with `since`."""

    def __init__(self, uid: str, stack: DevRun) -> None:
        self.uid = uid
        self.stack = stack
        self.token = stack.token(uid)
        self.got: list[Got] = []
        self.frames: list[dict[str, Any]] = []  # everything but pushes (recovered, ...)
        self.last_pos: str | None = None
        self.proxy: TcpProxy | None = None
        self.gateways: list[str] = []
        self.where: str | None = None
        self.refusals: list[str] = []  # reconnects refused (a draining gateway: 503)
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None

    async def _dispatch(self, http: httpx.AsyncClient) -> tuple[str, str]:
        resp = await http.get(
            f"{self.stack.api_url}/v1/dispatch", headers={"Authorization": f"Bearer {self.token}"}
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        self.gateways.append(body["gateway_id"])
        self.where = body["gateway_id"]
        return body["gateway_id"], body["ws_url"]

    async def start(self, http: httpx.AsyncClient) -> None:
        _, ws_url = await self._dispatch(http)
        port = urlsplit(ws_url).port
        assert port is not None, ws_url
        self.proxy = TcpProxy(port)
        await self.proxy.start()
        await self._open(f"ws://127.0.0.1:{self.proxy.port}/ws?token={self.token}")

    async def _open(self, url: str) -> None:
        self._ws = await connect(url, ping_interval=None, open_timeout=10)
        self._reader = asyncio.create_task(self._read(self._ws), name=f"raw-{self.uid}")

    async def _read(self, ws: ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ConnectionClosed):
            async for data in ws:
                frame = json.loads(data)
                if frame.get("type") == "push":
                    self.got.append(
                        Got(frame["msg_id"], key_of(frame.get("content")),
                            frame.get("recovered") is True, loop.time(), self.where)
                    )  # fmt: skip
                    self.last_pos = frame["pos"]
                else:
                    self.frames.append(frame)

    async def cut_and_resume(self, http: httpx.AsyncClient, cut_for_s: float) -> None:
        assert self.proxy is not None and self._ws is not None and self._reader is not None
        self.proxy.cut()
        await asyncio.sleep(cut_for_s)
        # Give up on the silent connection: abort it (no close frame, nothing sent).
        self._ws.transport.abort()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        assert self.last_pos is not None, "no push before the cut: nothing to resume from"
        for _ in range(RESUME_TRIES):
            _, ws_url = await self._dispatch(http)
            try:
                await self._open(f"{ws_url}?token={self.token}&since={self.last_pos}")
                return
            except (OSError, TimeoutError, WebSocketException) as exc:
                # As a real client would: dispatch may still name a gateway that began
                # to drain within its fleet cache's age; that one answers 503.
                self.refusals.append(f"{self.where}: {exc!r}")
                await asyncio.sleep(RESUME_BACKOFF_S)
        raise AssertionError(f"{self.uid} could not reconnect: {self.refusals}")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(), 2)
        if self.proxy is not None:
            await self.proxy.aclose()


# ---------------------------------------------------------------------------- the load
