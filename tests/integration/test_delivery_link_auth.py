"""Who may use a gateway's delivery link, over real sockets: strangers (no ticket, a
used one, no hello, a frame too big, junk) are refused, counted and logged without the
ticket, and a router still gets through; with mTLS the link is TLS, and plain text to
it gets nothing."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from router.gateway_rpc.client import GrpcGatewayClients
from router.testing import deliver_one
from shared.batches import to_batch
from shared.internal_auth import load_tls
from shared.link_frames import frame
from shared.proto import gateway_pb2
from socket_gateway import link_server
from tests.integration.gateway_calls import (
    Raw,
    ask_ticket,
    delivered_over_a_link,
    hello,
    linked,
    message,
    stranger,
    tls_settings,
)
from tests.integration.stack import client, gateway, nothing_more, recv_json, settings
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


async def test_strangers_are_refused_counted_and_logged_without_the_ticket(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(link_server, "HELLO_TIMEOUT_S", 0.3)
    monkeypatch.setattr(link_server, "LOG_EVERY_S", 0.0)
    caplog.set_level(logging.WARNING, "socket_gateway.link_server")
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "a") as a:
        assert gw.ports is not None and gw.ports.link is not None
        offer = await ask_ticket(gw)
        assert offer.port and offer.gateway_id == "gw1" and len(offer.ticket) == 32
        port = offer.port
        call = frame(
            gateway_pb2.StreamCall(
                call_id=1, batches=[to_batch(message(1), ["a"], "s1")]
            ).SerializeToString()
        )
        cases = [
            (hello(b"x" * 32), "no valid ticket"),  # a made-up ticket
            (call, "no valid ticket"),  # a call with no hello
            ((64 << 20).to_bytes(4, "big"), "no hello first"),  # a 64 MiB frame's header
            (b"", "no hello within"),  # nothing at all
        ]
        for n, (data, why) in enumerate(cases):
            started = time.monotonic()
            raw = await stranger(port, data)
            assert len(raw.replies) == 1, n
            refusal = raw.replies[0]
            assert refusal.call_id == 0 and why in refusal.error, (n, refusal)
            assert refusal.error_code in ("UNAUTHENTICATED", "DEADLINE_EXCEEDED"), refusal
            assert time.monotonic() - started < 3.0
        assert (
            gw.deliver_service.links.refused == len(cases) and gw.deliver_service.links.opened == 0
        )

        # A real ticket opens a link once; used again, it is refused.
        raw_ok = asyncio.get_running_loop().create_connection(Raw, "127.0.0.1", port)
        transport, ok = await raw_ok
        transport.write(hello(offer.ticket) + call)
        await wait_for(lambda: len(ok.replies) == 2, "the welcome and the reply")
        assert ok.replies[0].call_id == 0 and not ok.replies[0].error_code
        assert list(ok.replies[1].replies[0].delivered) == ["a"]
        assert (await recv_json(a))["content"] == {"n": 1}
        again = await stranger(port, hello(offer.ticket))
        assert "no valid ticket" in again.replies[0].error
        # On an open link: a frame over the limit (16 MiB) and a frame that is no
        # StreamCall each end the link, with the reason.
        transport.write((17 << 20).to_bytes(4, "big"))
        await asyncio.wait_for(ok.closed, 5)
        assert ok.replies[-1].error_code == "RESOURCE_EXHAUSTED", ok.replies[-1]
        fresh = await ask_ticket(gw)
        junk = await stranger(port, hello(fresh.ticket), frame(b"\xff\xff\xff"))
        assert junk.replies[-1].error_code == "INVALID_ARGUMENT", junk.replies
        assert gw.deliver_service.links.bad == 2 and gw.deliver_service.links.opened == 2
        assert gw.deliver_service.links.refused == len(cases) + 1
        assert await nothing_more(a, 0.2)
        logged = caplog.text
        assert "refused" in logged and "delivery link" in logged
        for ticket in (offer.ticket, fresh.ticket):
            assert ticket.hex() not in logged and repr(ticket) not in logged

        # A router still gets its link and its calls through.
        clients = GrpcGatewayClients()
        try:
            await linked(clients, "gw1", f"127.0.0.1:{gw.grpc_port}")
            reply = await deliver_one(
                clients, "gw1", f"127.0.0.1:{gw.grpc_port}", to_batch(message(2), ["a"], "s2"), 5.0
            )
            assert list(reply.delivered) == ["a"]
            assert (await recv_json(a))["content"] == {"n": 2}
        finally:
            await clients.close()


async def test_with_mtls_the_link_is_tls(
    redis_url: str, prefix: str, certs: tuple[Path, Path]
) -> None:
    ours, _ = certs
    async with gateway(redis_url, prefix, "gw1", "g1", **tls_settings(ours)) as gw:
        assert gw.ports is not None and gw.ports.link is not None
        address = f"127.0.0.1:{gw.grpc_port}"
        tls = load_tls(settings(redis_url, prefix, **tls_settings(ours, "imroute-gateway")))
        clients = GrpcGatewayClients(tls=tls)
        try:
            async with client(gw, "alice") as ws:
                await linked(clients, "gw1", address)
                reply = await deliver_one(
                    clients, "gw1", address, to_batch(message(1), ["alice"], "t1"), 2.0
                )
                assert list(reply.delivered) == ["alice"]
                assert (await recv_json(ws))["content"] == {"n": 1}
                assert gw.deliver_service.links.calls == 1
                # Plain text to the TLS port gets nothing but a closed socket.
                port = (await ask_ticket(gw, tls)).port
                plain = await stranger(port, b"\x00\x00\x00\x02hi")
                assert plain.replies == []
                assert gw.deliver_service.links.opened == 1
        finally:
            await clients.close()


async def test_sockets_waiting_for_a_hello_are_capped(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Strangers that connect and say nothing hold a socket each for HELLO_TIMEOUT_S: at
    # most MAX_PRE_HELLO at once; past it a new one is refused at once.
    monkeypatch.setattr(link_server, "MAX_PRE_HELLO", 3)
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "a") as a:
        port = (await ask_ticket(gw)).port
        loop = asyncio.get_running_loop()
        held = [await loop.create_connection(Raw, "127.0.0.1", port) for _ in range(3)]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        extra = await stranger(port)
        assert time.monotonic() - started < 1.0
        assert extra.replies[0].error_code == "RESOURCE_EXHAUSTED", extra.replies
        assert "wait for a hello" in extra.replies[0].error
        assert all(not raw.closed.done() for _, raw in held)  # the three still wait
        assert gw.ports is not None and gw.ports.link is not None
        link = gw.ports.link
        assert link.waiting == 3
        for transport, _ in held:
            transport.close()
        await wait_for(lambda: link.waiting == 0, "the closes")
        # A router gets its link and its calls through.
        await delivered_over_a_link(gw, "gw1", a, 5, "h5")
