"""Strangers' silent sockets on a gateway's delivery link (docs/operations/security-review.md, "The
delivery link before its hello"): counted and timed from the TCP accept, before TLS,
capped per address, and with every place taken the address holding the most loses its
oldest to a newcomer, so a push service's link still gets in and delivers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from websockets.asyncio.client import connect

from router.gateway_rpc.client import GrpcGatewayClients
from router.testing import deliver_one
from shared.batches import to_batch
from shared.internal_auth import TlsFiles, load_tls
from shared.proto import gateway_pb2
from shared.proto.gateway_service import GatewayStub
from socket_gateway import link_server
from tests.integration.floods import Flood
from tests.integration.gateway_calls import (
    Raw,
    ask_ticket,
    delivered_over_a_link,
    linked,
    message,
    stranger,
    tls_settings,
)
from tests.integration.procs import gateway_process, scrape
from tests.integration.stack import client, gateway, ready, recv_json, settings, token
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.alone]


def _still_open(floods: list[Flood]) -> str:
    """What is left open, for a failure's message: per address, how many and how old."""
    now = time.monotonic()
    return "; ".join(
        f"{f.source}: {len(f.live)} open, the oldest {max(now - s.opened for s in f.live):.1f} s"
        for f in floods
        if f.live
    )


async def _link_port(address: str, tls: TlsFiles) -> int:
    """The link port a gateway process offers, asked with mTLS."""
    credentials = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)
    options = [("grpc.ssl_target_name_override", "imroute-gateway")]
    async with grpc.aio.secure_channel(address, credentials, options) as channel:
        rpc: Any = GatewayStub(channel)
        reply: gateway_pb2.LinkReply = await rpc.Link(gateway_pb2.LinkRequest(), timeout=5)
        return reply.port


async def test_a_push_service_link_takes_the_place_of_the_biggest_holders_oldest(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link_server, "MAX_PRE_HELLO", 4)
    monkeypatch.setattr(link_server, "MAX_PRE_HELLO_PER_PEER", 2)
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "a") as a:
        assert gw.ports is not None and gw.ports.link is not None
        link = gw.ports.link
        port = (await ask_ticket(gw)).port
        loop = asyncio.get_running_loop()
        held = [
            await loop.create_connection(Raw, "127.0.0.1", port, local_addr=(source, 0))
            for source in ("127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3")
        ]
        await wait_for(lambda: link.waiting == 4, "four waiting")
        # A third from one address is refused at once, with the reason.
        started = time.monotonic()
        extra = await asyncio.wait_for(
            loop.create_connection(Raw, "127.0.0.1", port, local_addr=("127.0.0.2", 0)), 1
        )
        await asyncio.wait_for(extra[1].closed, 1)
        assert time.monotonic() - started < 1.0
        refusal = extra[1].replies[0]
        assert refusal.error_code == "RESOURCE_EXHAUSTED" and "127.0.0.2" in refusal.error
        # Full: the router's link (from 127.0.0.1) takes the place of the oldest socket
        # of the address that got to hold the most first, and delivers.
        await delivered_over_a_link(gw, "gw1", a, 7, "e7")
        oldest = held[0][1]
        await asyncio.wait_for(oldest.closed, 1)
        assert oldest.replies[0].error_code == "RESOURCE_EXHAUSTED", oldest.replies
        assert "the most from 127.0.0.2" in oldest.replies[0].error
        assert all(not raw.closed.done() for _, raw in held[1:])
        assert gw.deliver_service.links.refused == 2
        for transport, _ in held:
            transport.close()
        # A stranger from yet another address still gets its refusal frame.
        late = await stranger(port, b"\x00\x00\x00\x01x")
        assert late.replies[0].error_code == "UNAUTHENTICATED"


async def test_with_mtls_silent_sockets_are_counted_and_cut_before_tls(
    redis_url: str, prefix: str, certs: tuple[Path, Path]
) -> None:
    """1000 plain TCP sockets from 127.0.0.2 on the TLS link port, and 64 from each of
    three more addresses so that every place is taken: all are closed within the hello
    deadline from their accept (at once, past their address's cap), and a real push
    service client still opens its link and delivers over it."""
    ours, _ = certs
    tls_env = {f"IMROUTE_{k.upper()}": v for k, v in tls_settings(ours).items() if v}
    async with gateway_process(redis_url, prefix, "gwt", **tls_env) as (ws, grpc, metrics):
        tls = load_tls(settings(redis_url, prefix, **tls_settings(ours, "imroute-gateway")))
        assert tls is not None
        clients = GrpcGatewayClients(tls=tls)
        address = f"127.0.0.1:{grpc}"
        async with connect(f"ws://127.0.0.1:{ws}/ws?token={token('alice')}") as alice:
            await ready(alice)
            port = await _link_port(address, tls)
            floods = [Flood(port, f"127.0.0.{n}", 1000 if n == 2 else 64) for n in (2, 3, 4, 5)]
            try:
                for f in floods:
                    await f.fill()
                await linked(clients, "gwt", address)
                reply = await deliver_one(
                    clients, "gwt", address, to_batch(message(1), ["alice"], "t1"), 5.0
                )
                assert list(reply.delivered) == ["alice"]
                assert (await recv_json(alice))["content"] == {"n": 1}
                await wait_for(
                    lambda: all(not f.live for f in floods),
                    "every silent socket closed",
                    link_server.HELLO_TIMEOUT_S + 3,
                    detail=lambda: _still_open(floods),
                )
                # Each socket's life, from its connect to its close: the fill, the link
                # and the delivery above take seconds of their own on a loaded machine.
                held = [s for f in floods for s in f.held_s]
                assert max(held) < link_server.HELLO_TIMEOUT_S + 1.5, max(held)
                # 127.0.0.2 past its 64 was refused at once.
                assert sorted(floods[0].held_s)[900] < 1.0
                connects = sum(f.connects - f.failed for f in floods)
                counts = await scrape(metrics, "imroute_gateway_delivery_link")
                assert counts["_refusals_total"] == connects, (counts, connects)
                assert counts["s"] == 1  # the push service's link is still open
            finally:
                for f in floods:
                    f.close()
                await clients.close()
