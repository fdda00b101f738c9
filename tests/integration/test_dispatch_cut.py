"""Clients cut off from their gateway move to another gateway of the group, and dispatch
stops sending anyone there until it is reachable again.

Real processes: a push service, two gateways of one group, and SDK clients (in this
process). The clients reach gw1 only through a TCP link (gw1 advertises the link's
address): cutting it refuses new connects and resets the open ones, while gw1 itself
runs on, heartbeating and announcing fewer and fewer connections, which without the
clients' reports made it dispatch's first choice for everyone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from imroute_client import ImrouteClient
from websockets.asyncio.client import ClientConnection, connect

from router.processes.ports import free_port_block
from tests.integration.fault_clients import SdkUser
from tests.integration.http_raw import push_service
from tests.integration.procs import BIN, gateway_env, running, ws_url_of
from tests.integration.stack import AUTH, token
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

CUT_USERS = 12  # SDK clients on gw1 when it is cut off
BALLAST = 30  # raw connections held on gw2, so gw1 is the emptiest from the start
MOVE_BOUND_S = 20.0  # every cut client is on gw2 within this
WINDOW_S = 10  # IMROUTE_DISPATCH_SKIP_WINDOW_S


class Link:
    """The clients' way to one gateway: a TCP forwarder on the port the gateway
    advertises. `cut()` refuses new connects and resets the open ones (a firewall's
    REJECT between the clients and the gateway); `heal()` opens it again."""

    def __init__(self, port: int, upstream_port: int) -> None:
        self.port = port
        self.upstream_port = upstream_port
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._pumps: set[asyncio.Task[None]] = set()

    async def heal(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers += [writer, up_writer]
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()

    def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def aclose(self) -> None:
        self.cut()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)


def gateway_argv(gid: str, ws_port: int) -> list[str]:
    return [str(BIN / "imroute"), "gateway", "--id", gid, "--group", "g1",
            "--ws-port", str(ws_port), "--grpc-port", "0", "--heartbeat", "0.5"]  # fmt: skip


async def test_clients_cut_off_from_a_gateway_move_and_dispatch_skips_it_until_it_heals(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    base = free_port_block([0, 1])
    gw1_port, link_port = base, base + 1
    env = gateway_env(redis_url, prefix)
    gw1_env = {**env, "IMROUTE_WS_PUBLIC_URL": f"ws://127.0.0.1:{link_port}/ws"}
    link = Link(link_port, gw1_port)
    users: list[SdkUser] = []
    ballast: list[ClientConnection] = []
    window = {"IMROUTE_DISPATCH_SKIP_WINDOW_S": str(WINDOW_S)}
    with (
        push_service(redis_url, prefix, tmp_path, **window) as (_, api_port),
        running(gateway_argv("gw1", gw1_port), gw1_env) as gw1,
        running(gateway_argv("gw2", 0), env) as gw2,
    ):
        try:
            assert await ws_url_of(gw1) == f"ws://127.0.0.1:{link_port}/ws"
            gw2_url = await ws_url_of(gw2)
            await link.heal()
            api = f"http://127.0.0.1:{api_port}"
            async with httpx.AsyncClient(base_url=api, timeout=10) as http:

                async def connections() -> dict[str, int]:
                    resp = await http.get("/v1/gateways", headers=AUTH)
                    return {g["gateway_id"]: g["connections"] for g in resp.json()["gateways"]}

                def sent_to(uid: str, gateway_id: str) -> Callable[[], Awaitable[bool]]:
                    async def check() -> bool:
                        return await dispatched(uid) == gateway_id

                    return check

                async def dispatched(uid: str) -> str:
                    resp = await http.get(
                        "/v1/dispatch", headers={"Authorization": f"Bearer {token(uid)}"}
                    )
                    assert resp.status_code == 200, resp.text
                    return str(resp.json()["gateway_id"])

                for i in range(BALLAST):
                    ballast.append(await connect(f"{gw2_url}?token={token(f'ballast{i}')}"))

                async def gw2_full() -> bool:
                    return (await connections()).get("gw2") == BALLAST

                await wait_for(gw2_full, "gw2 announcing its ballast", 10, every=0.1)
                for i in range(CUT_USERS):
                    client = ImrouteClient(api, token(f"cut{i}"), http=http, backoff_min_s=0.05,
                                           backoff_max_s=1.0)  # fmt: skip
                    users.append(SdkUser(f"cut{i}", client))
                    users[-1].start()

                async def all_on(gateway_id: str) -> bool:
                    return all(u.client.gateway_id == gateway_id for u in users)

                await wait_for(
                    lambda: all_on("gw1"), "the SDK clients on gw1 (the emptiest)", 15, every=0.1
                )
                # They have been there a while: their connects are older than the window.
                await asyncio.sleep(WINDOW_S + 1)

                # gw1 cut off from its clients; it lives on, heartbeating.
                loop = asyncio.get_running_loop()
                cut_at = loop.time()
                link.cut()
                pushed = []
                for u in users:  # pushed during the cut: they must reach the clients
                    resp = await http.post(
                        "/v1/push", json={"to": [u.uid], "content": {"n": u.uid}}, headers=AUTH
                    )
                    assert resp.status_code == 200, resp.text
                    pushed.append(resp.json()["msg_id"])
                await wait_for(
                    lambda: all_on("gw2"), "every cut client on gw2", MOVE_BOUND_S, every=0.1
                )
                moved_s = loop.time() - cut_at

                async def all_pushes_in() -> bool:
                    return all(
                        any(g.msg_id == m for g in u.got)
                        for u, m in zip(users, pushed, strict=True)
                    )

                await wait_for(all_pushes_in, "the cut clients' pushes", 10, every=0.1)
                arrived_s = loop.time() - cut_at
                print(f"\ncut clients all on gw2 after {moved_s:.2f}s; pushes in {arrived_s:.2f}s")
                assert all(u.client.stats.avoided >= 1 for u in users)
                assert all(u.error is None for u in users), [u.error for u in users]

                # gw1 announces no connections and gw2 42; yet while the clients'
                # reports are recent, fresh clients are sent to gw2.
                async def gw1_empty() -> bool:
                    return (await connections())["gw1"] == 0

                await wait_for(gw1_empty, "gw1 announcing no connections", 5, every=0.1)
                await wait_for(sent_to("fresh", "gw2"), "dispatch skipping gw1", 5, every=0.1)
                fresh = [await dispatched(f"fresh{i}") for i in range(20)]
                assert fresh == ["gw2"] * 20

                # gw1 reachable again: once the reports are older than the window, it is
                # chosen again, and a client connects there.
                await link.heal()
                back_s = await wait_for(
                    sent_to("later", "gw1"), "gw1 chosen again", WINDOW_S + 8, every=0.1
                )
                print(f"gw1 chosen again {back_s:.2f}s after it healed")
                late = ImrouteClient(api, token("later"), http=http)
                async with late:
                    await asyncio.wait_for(late.connect(), 10)
                    assert late.gateway_id == "gw1"
        finally:
            for u in users:
                await u.stop()
            for ws in ballast:
                await ws.close()
            await link.aclose()
