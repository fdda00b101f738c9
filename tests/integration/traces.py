"""The traces tests' stack: a push service and two gateways as processes, a client per user."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from websockets.asyncio.client import ClientConnection, connect

from router.processes.ports import free_port
from tests.conftest import SECRET
from tests.integration.procs import BIN, read_until, running, service_env
from tests.integration.stack import AUTH, ready, token

__all__ = ["GATEWAYS", "USERS", "Stack", "clients", "processes"]

GATEWAYS = {"gwa": "ga", "gwb": "gb"}  # gateway id -> its group
USERS = {"a1": "gwa", "a2": "gwa", "b1": "gwb", "b2": "gwb"}


@dataclass
class Stack:
    api: str
    ws_urls: dict[str, str]


@contextmanager
def processes(
    redis_url: str, prefix: str, tmp_path: Path, env_extra: dict[str, str]
) -> Iterator[Stack]:
    """A push service and the two gateways, as real processes."""
    env = service_env(redis_url, prefix, tmp_path, IMROUTE_SECRET=SECRET, **env_extra)
    port = free_port()
    with ExitStack() as stack:
        push = stack.enter_context(
            running([str(BIN / "imroute"), "push-service", "--port", str(port)], env)
        )
        gws = {
            gw: stack.enter_context(
                running(
                    [
                        str(BIN / "imroute"),
                        "gateway",
                        "--id",
                        gw,
                        "--group",
                        group,
                        "--ws-port",
                        "0",
                        "--grpc-port",
                        "0",
                    ],
                    env,
                )
            )
            for gw, group in GATEWAYS.items()
        }
        read_until(push, "Uvicorn running on")
        ws_urls = {}
        for gw, proc in gws.items():
            found = re.search(r"ws=(\S+)", read_until(proc, "ready")[-1])
            assert found, gw
            ws_urls[gw] = found.group(1)
        yield Stack(f"http://127.0.0.1:{port}", ws_urls)


@asynccontextmanager
async def clients(
    stack: Stack, http: httpx.AsyncClient
) -> AsyncIterator[dict[str, ClientConnection]]:
    """One real WebSocket client per user, on its gateway; once the push service sees
    both gateways and every route."""
    async with AsyncExitStack() as exits:
        sockets = {}
        for uid, gw in USERS.items():
            ws = await exits.enter_async_context(connect(f"{stack.ws_urls[gw]}?token={token(uid)}"))
            await ready(ws)
            sockets[uid] = ws
        for _ in range(100):
            resp = await http.get(f"{stack.api}/v1/gateways", headers=AUTH)
            routes = [
                (await http.get(f"{stack.api}/v1/users/{uid}/route", headers=AUTH)).status_code
                for uid in USERS
            ]
            if len(resp.json()["gateways"]) == 2 and routes == [200] * len(USERS):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the push service never saw both gateways and every route")
        yield sockets
