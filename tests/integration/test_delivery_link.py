"""The delivery link (README, "The delivery link"), over real sockets: once open, calls
go on it and each gets its own reply; a refused call fails alone; a stopped gateway
fails a call at its deadline and a killed one every waiting call at once, after which
calls go over gRPC until a new link is open; a gateway with the link off, or one whose link
cannot be reached, gets gRPC (strangers and mTLS: test_delivery_link_auth.py). Real
gateway processes are stopped with SIGSTOP and killed with SIGKILL."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

import grpc.aio
import pytest

from router.devtools.ports import free_port, free_port_block
from router.gateway_rpc import links as links_module
from router.gateway_rpc.grpc_client import GrpcGatewayClients
from shared.batches import to_batch
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2
from shared.proto.gateway_pb2_grpc import GatewayServicer, add_GatewayServicer_to_server
from socket_gateway.metrics import render
from tests.conftest import SECRET
from tests.integration.procs import base_env, read_until, running
from tests.integration.stack import client, gateway, nothing_more, recv_json
from tests.integration.test_deliver import message
from tests.integration.test_deliver_stream import gateway_argv

pytestmark = pytest.mark.integration


async def until(
    check: Callable[[], bool],
    what: str,
    timeout: float = 5.0,
    state: Callable[[], str] = lambda: "",
) -> None:
    """Until `check()`; past `timeout`, fail naming `what` (and `state()`, what is left)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what} {state()}".rstrip()
        await asyncio.sleep(0.01)


async def linked(clients: GrpcGatewayClients, gid: str, address: str, opened: int = 1) -> None:
    """Make calls (over gRPC, until then) until `opened` links have been opened: a link
    is opened, or tried again, when a call finds none."""
    deadline = time.monotonic() + 5.0
    n = 0
    while clients.links_opened < opened:
        assert time.monotonic() < deadline, "timed out waiting for the delivery link"
        n += 1
        batch = to_batch(message(0), ["nobody"], f"warm-{opened}-{n}")
        await clients.deliver(gid, address, batch, 5.0)
        await asyncio.sleep(0.02)


async def test_calls_go_on_the_link_and_each_gets_its_own_reply(
    redis_url: str, prefix: str, redis: object
) -> None:
    clients = GrpcGatewayClients()
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        assert gw.ports is not None and gw.ports.link is not None
        address = f"127.0.0.1:{gw.grpc_port}"
        async with client(gw, "a") as a, client(gw, "b") as b:
            await linked(clients, "gw1", address)
            assert gw.deliver_service.links.open == 1 and gw.deliver_service.links.calls == 0
            streamed = gw.deliver_service.calls  # the first call went over gRPC
            uids = ["a", "b", "nobody"]
            batches = [to_batch(message(n), [uids[n % 3]], f"batch-{n}") for n in range(60)]
            many = [clients.deliver_many("gw1", address, batches[n : n + 3], 5.0)
                    for n in range(30, 60, 3)]  # fmt: skip
            replies = await asyncio.gather(
                *(clients.deliver("gw1", address, batches[n], 5.0) for n in range(30)), *many
            )
            flat = replies[:30] + [r for group in replies[30:] for r in group]  # type: ignore[union-attr]
            for n, reply in enumerate(flat):
                uid = uids[n % 3]
                assert isinstance(reply, gateway_pb2.DeliverReply)
                if uid == "nobody":
                    assert list(reply.missing) == ["nobody"] and not reply.delivered, n
                else:
                    assert list(reply.delivered) == [uid] and not reply.missing, n
            for uid, ws in (("a", a), ("b", b)):
                got = sorted([(await recv_json(ws))["content"]["n"] for _ in range(20)])
                assert got == list(range(uids.index(uid), 60, 3)), uid
                assert await nothing_more(ws, 0.1)
            assert gw.deliver_service.links.calls == 40  # 30 single calls and 10 of three
            assert gw.deliver_service.calls == streamed + 40
            scrape = render(gw.metrics).decode()
            assert "imroute_gateway_delivery_links 1.0" in scrape

            # A call the gateway refuses (a bad batch) fails alone; nothing of it is
            # written, and the link goes on.
            good = to_batch(message(100), ["a"], "batch-100")
            bad = to_batch(message(101), ["b"], "batch-101")
            bad.seqs.extend([1, 2])  # two seqs for one uid
            with pytest.raises(GatewayUnavailable) as refused:
                await clients.deliver_many("gw1", address, [good, bad], 5.0)
            assert refused.value.code == "INVALID_ARGUMENT"
            assert "batch 1: seqs must be empty or one per uid" in refused.value.reason
            assert await nothing_more(a, 0.2) and await nothing_more(b, 0.1)
            again = await clients.deliver("gw1", address, good, 5.0)
            assert list(again.delivered) == ["a"]
            assert (await recv_json(a))["content"] == {"n": 100}
            assert clients.links_opened == 1 and gw.deliver_service.links.calls == 42
        await clients.close()
        await until(lambda: gw.deliver_service.links.open == 0, "the link's end")


async def test_the_switch_from_the_stream_to_the_link_loses_nothing(
    redis_url: str, prefix: str, redis: object
) -> None:
    # Calls started one after another, never waiting for each other, while the link
    # opens: the first go on the stream, the rest on the link; the stream ends once it
    # has answered its own, and every push arrives once.
    clients = GrpcGatewayClients()
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "a") as a:
        address = f"127.0.0.1:{gw.grpc_port}"
        calls = []
        for n in range(300):
            batch = to_batch(message(n), ["a"], f"switch-{n}")
            calls.append(asyncio.create_task(clients.deliver("gw1", address, batch, 5.0)))
            await asyncio.sleep(0.0005 if n % 10 == 0 else 0)
        replies = await asyncio.gather(*calls)
        assert all(list(r.delivered) == ["a"] for r in replies)
        got = sorted([(await recv_json(a))["content"]["n"] for _ in range(300)])
        assert got == list(range(300)) and await nothing_more(a, 0.1)
        links = gw.deliver_service.links
        assert clients.links_opened == 1 and 0 < links.calls < 300, links.calls
        await until(lambda: gw.deliver_service.open_streams == 0, "the stream's end")
        await clients.close()


async def test_a_cut_link_fails_its_calls_at_once_and_another_opens(
    redis_url: str, prefix: str, redis: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The link's socket is cut (reset) under a call waiting for its reply: the call
    # fails UNAVAILABLE at once (a retry may follow: its batch may have arrived, and
    # the gateway would drop it as a duplicate), the next goes over gRPC, and a new link
    # opens RETRY_S later.
    monkeypatch.setattr(links_module, "RETRY_S", 0.3)
    clients = GrpcGatewayClients()
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "a") as a:
        address = f"127.0.0.1:{gw.grpc_port}"
        await linked(clients, "gw1", address)
        link = clients._links.get("gw1", address) if clients._links is not None else None
        assert link is not None and link._transport is not None
        waiting = asyncio.create_task(
            clients.deliver("gw1", address, to_batch(message(1), ["a"], "cut-1"), 10.0)
        )
        await asyncio.sleep(0)  # the call is written and waits for its reply
        started = time.monotonic()
        link._transport.abort()  # a reset, as a cut network gives
        with pytest.raises(GatewayUnavailable) as cut:
            await waiting
        assert cut.value.code == "UNAVAILABLE" and time.monotonic() - started < 1.0
        reply = await clients.deliver("gw1", address, to_batch(message(2), ["a"], "cut-2"), 5.0)
        assert list(reply.delivered) == ["a"]  # over gRPC meanwhile
        await linked(clients, "gw1", address, opened=2)  # links open as calls come
        calls = gw.deliver_service.links.calls
        reply = await clients.deliver("gw1", address, to_batch(message(3), ["a"], "cut-3"), 5.0)
        assert list(reply.delivered) == ["a"] and gw.deliver_service.links.calls == calls + 1
        got = [(await recv_json(a))["content"]["n"] for _ in range(2)]
        if got[0] == 1:  # the cut call's batch got there before the cut
            got = [*got[1:], (await recv_json(a))["content"]["n"]]
        assert got == [2, 3] and await nothing_more(a, 0.1)
        await clients.close()


async def test_a_stopped_gateway_fails_link_calls_at_their_deadline_and_a_killed_one_at_once(
    redis_url: str, prefix: str, redis: object
) -> None:
    port = free_port_block([0])
    address = f"127.0.0.1:{port}"
    env = base_env(IMROUTE_REDIS_URL=redis_url, IMROUTE_REDIS_PREFIX=prefix, IMROUTE_SECRET=SECRET)
    clients = GrpcGatewayClients(close_grace_s=0.1)
    try:
        with running(gateway_argv(port, "gwl"), env) as proc:
            await asyncio.to_thread(read_until, proc, "ready")
            await linked(clients, "gwl", address)
            streams = clients.streams_opened

            # Stopped: a call fails at its own deadline, and the link goes on.
            proc.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(GatewayUnavailable) as late:
                await clients.deliver("gwl", address, to_batch(message(2), ["x"], "b2"), 0.4)
            elapsed = time.monotonic() - started
            assert late.value.code == "DEADLINE_EXCEEDED" and 0.35 < elapsed < 1.5, elapsed
            proc.send_signal(signal.SIGCONT)
            reply = await clients.deliver("gwl", address, to_batch(message(3), ["x"], "b3"), 5.0)
            assert list(reply.missing) == ["x"]
            assert clients.links_opened == 1 and clients.streams_opened == streams

            # Stopped with calls waiting, then killed: each fails with UNAVAILABLE (a
            # retry may follow) at once, long before its deadline.
            proc.send_signal(signal.SIGSTOP)
            waiting = [
                asyncio.create_task(
                    clients.deliver("gwl", address, to_batch(message(n), ["x"], f"b{n}"), 30.0)
                )
                for n in range(4, 9)
            ]
            await asyncio.sleep(0.3)
            assert not any(t.done() for t in waiting)
            started = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
            results = await asyncio.gather(*waiting, return_exceptions=True)
            assert time.monotonic() - started < 3.0
            for result in results:
                assert isinstance(result, GatewayUnavailable), result
                assert result.code == "UNAVAILABLE", result

        # Back at the same address: the next call goes over gRPC and a new link opens.
        with running(gateway_argv(port, "gwl"), env) as proc:
            await asyncio.to_thread(read_until, proc, "ready")
            clients.reconnect(address)
            reply = await clients.deliver("gwl", address, to_batch(message(9), ["x"], "b9"), 5.0)
            assert list(reply.missing) == ["x"]
            await until(lambda: clients.links_opened == 2, "a new link")
            reply = await clients.deliver("gwl", address, to_batch(message(10), ["x"], "b10"), 5.0)
            assert list(reply.missing) == ["x"]
    finally:
        await clients.close()


async def test_no_link_means_grpc(redis_url: str, prefix: str, redis: object) -> None:
    # A gateway with the link off answers port 0: its calls stay on the stream.
    async with gateway(redis_url, prefix, "gw1", "g1", delivery_link=False) as gw:
        assert gw.ports is not None and gw.ports.link is None
        clients = GrpcGatewayClients()
        address = f"127.0.0.1:{gw.grpc_port}"
        try:
            for n in range(5):
                reply = await clients.deliver(
                    "gw1", address, to_batch(message(n), ["x"], f"o{n}"), 5.0
                )
                assert list(reply.missing) == ["x"]
                await asyncio.sleep(0.05)
            assert clients.links_opened == 0 and gw.deliver_service.open_streams == 1
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

    async def Deliver(self, request: Any, context: Any) -> gateway_pb2.DeliverReply:
        return gateway_pb2.DeliverReply(missing=request.uids)


async def test_an_unreachable_link_leaves_calls_on_grpc_and_is_tried_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer = _Unreachable(free_port())
    server = grpc.aio.server()
    add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    clients = GrpcGatewayClients(links=True, streams=False)  # unary calls to a bare servicer
    address = f"127.0.0.1:{port}"
    try:
        with caplog.at_level(logging.WARNING, "router.gateway_rpc.links"):
            for n in range(10):
                batch = to_batch(message(n), ["x"], f"u{n}")
                reply = await clients.deliver("gwu", address, batch, 2.0)
                assert list(reply.missing) == ["x"]
                await asyncio.sleep(0.05)
        assert servicer.asked == 1  # not again before RETRY_S
        assert clients.links_opened == 0
        assert "no delivery link to gateway gwu yet" in caplog.text
    finally:
        await clients.close()
        await server.stop(0)
