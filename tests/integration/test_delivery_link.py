"""The delivery link (docs/architecture/gateway-calls.md), over real sockets: calls switch to
it from gRPC as it opens, losing nothing; a cut link fails its calls at once, after
which calls go over gRPC until a new link is open; a gateway with the link off, or one
whose link cannot be reached, gets gRPC DeliverMany calls (the scenarios both carriers
share: test_carriers.py; strangers and mTLS: test_delivery_link_auth.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc.aio
import pytest

from router.gateway_rpc import client as gateway_client
from router.gateway_rpc.client import GrpcGatewayClients
from router.processes.ports import free_port
from router.testing import deliver_one
from shared.batches import to_batch
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2
from shared.proto.gateway_service import GatewayServicer, add_GatewayServicer_to_server
from tests.integration.gateway_calls import linked, message
from tests.integration.stack import client, gateway, nothing_more, recv_json

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("redis")
async def test_the_switch_from_grpc_to_the_link_loses_nothing(redis_url: str, prefix: str) -> None:
    # Calls started one after another, never waiting for each other, while the link
    # opens: the first go over gRPC, the rest on the link, and every push arrives once.
    clients = GrpcGatewayClients()
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "a") as a:
        address = f"127.0.0.1:{gw.grpc_port}"
        calls = []
        for n in range(300):
            batch = to_batch(message(n), ["a"], f"switch-{n}")
            calls.append(asyncio.create_task(deliver_one(clients, "gw1", address, batch, 5.0)))
            await asyncio.sleep(0.0005 if n % 10 == 0 else 0)
        replies = await asyncio.gather(*calls)
        assert all(list(r.delivered) == ["a"] for r in replies)
        got = sorted([(await recv_json(a))["content"]["n"] for _ in range(300)])
        assert got == list(range(300)) and await nothing_more(a, 0.1)
        links = gw.deliver_service.links
        assert clients.links_opened == 1 and 0 < links.calls < 300, links.calls
        await clients.close()


@pytest.mark.usefixtures("redis")
async def test_a_cut_link_fails_its_calls_at_once_and_another_opens(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The link's socket is cut (reset) under a call waiting for its reply: the call
    # fails UNAVAILABLE at once (a retry may follow: its batch may have arrived, and
    # the gateway would drop it as a duplicate), the next goes over gRPC, and a new link
    # opens RETRY_S later.
    monkeypatch.setattr(gateway_client, "RETRY_S", 0.3)
    clients = GrpcGatewayClients()
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "a") as a:
        address = f"127.0.0.1:{gw.grpc_port}"
        await linked(clients, "gw1", address)
        link = clients._link("gw1", address)
        assert link is not None and link._transport is not None
        waiting = asyncio.create_task(
            deliver_one(clients, "gw1", address, to_batch(message(1), ["a"], "cut-1"), 10.0)
        )
        await asyncio.sleep(0)  # the call is written and waits for its reply
        started = time.monotonic()
        link._transport.abort()  # a reset, as a cut network gives
        with pytest.raises(GatewayUnavailable) as cut:
            await waiting
        assert cut.value.code == "UNAVAILABLE" and time.monotonic() - started < 1.0
        reply = await deliver_one(
            clients, "gw1", address, to_batch(message(2), ["a"], "cut-2"), 5.0
        )
        assert list(reply.delivered) == ["a"]  # over gRPC meanwhile
        await linked(clients, "gw1", address, opened=2)  # links open as calls come
        calls = gw.deliver_service.links.calls
        reply = await deliver_one(
            clients, "gw1", address, to_batch(message(3), ["a"], "cut-3"), 5.0
        )
        assert list(reply.delivered) == ["a"] and gw.deliver_service.links.calls == calls + 1
        got = [(await recv_json(a))["content"]["n"] for _ in range(2)]
        if got[0] == 1:  # the cut call's batch got there before the cut
            got = [*got[1:], (await recv_json(a))["content"]["n"]]
        assert got == [2, 3] and await nothing_more(a, 0.1)
        await clients.close()


@pytest.mark.usefixtures("redis")
async def test_no_link_means_grpc(redis_url: str, prefix: str) -> None:
    # A gateway with the link off answers port 0: its calls stay DeliverMany calls.
    async with gateway(redis_url, prefix, "gw1", "g1", delivery_link=False) as gw:
        assert gw.ports is not None and gw.ports.link is None
        clients = GrpcGatewayClients()
        address = f"127.0.0.1:{gw.grpc_port}"
        try:
            for n in range(5):
                reply = await deliver_one(
                    clients, "gw1", address, to_batch(message(n), ["x"], f"o{n}"), 5.0
                )
                assert list(reply.missing) == ["x"]
                await asyncio.sleep(0.05)
            assert clients.links_opened == 0 and gw.deliver_service.calls == 5
        finally:
            await clients.close()


class _Unreachable(GatewayServicer):
    """A gateway whose link port nobody listens on (a firewall, a wrong advertise)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.asked = 0

    async def Link(self, request: Any, context: Any) -> gateway_pb2.LinkReply:
        self.asked += 1
        return gateway_pb2.LinkReply(port=self.port, ticket=b"t" * 32, gateway_id="gwu")

    async def DeliverMany(self, request: Any, context: Any) -> gateway_pb2.DeliverManyReply:
        return gateway_pb2.DeliverManyReply(
            replies=[gateway_pb2.DeliverReply(missing=b.uids) for b in request.batches]
        )


async def test_an_unreachable_link_leaves_calls_on_grpc_and_is_tried_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer = _Unreachable(free_port())
    server = grpc.aio.server()
    add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    clients = GrpcGatewayClients()
    address = f"127.0.0.1:{port}"
    try:
        with caplog.at_level(logging.WARNING, "router.gateway_rpc.client"):
            for n in range(10):
                batch = to_batch(message(n), ["x"], f"u{n}")
                reply = await deliver_one(clients, "gwu", address, batch, 2.0)
                assert list(reply.missing) == ["x"]
                await asyncio.sleep(0.05)
        assert servicer.asked == 1  # not again before RETRY_S
        assert clients.links_opened == 0
        assert "no delivery link to gateway gwu yet" in caplog.text
    finally:
        await clients.close()
        await server.stop(0)
