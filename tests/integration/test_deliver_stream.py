"""The router's long-lived DeliverStream to a gateway, over real gRPC: many calls share
one stream and each gets its own reply; a refused call fails alone; a stopped gateway
fails a call at its deadline and the stream survives; a killed one fails every waiting
call at once; a gateway without DeliverStream gets unary calls. Real gateway processes
are stopped with SIGSTOP and killed with SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import grpc
import grpc.aio
import pytest

from router.devtools.ports import free_port, free_port_block
from router.gateway_rpc.grpc_client import GrpcGatewayClients
from shared.batches import to_batch
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2
from shared.proto.gateway_pb2_grpc import GatewayServicer, add_GatewayServicer_to_server
from tests.conftest import SECRET
from tests.integration.procs import BIN, base_env, read_until, running
from tests.integration.stack import client, gateway, nothing_more, recv_json
from tests.integration.test_deliver import message

pytestmark = pytest.mark.integration


async def test_concurrent_calls_share_one_stream_and_each_gets_its_own_reply(
    redis_url: str, prefix: str, redis: object
) -> None:
    clients = GrpcGatewayClients(links=False)  # the stream itself: no delivery link
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        address = f"127.0.0.1:{gw.grpc_port}"
        async with client(gw, "a") as a, client(gw, "b") as b:
            uids = ["a", "b", "nobody"]
            batches = [to_batch(message(n), [uids[n % 3]], f"batch-{n}") for n in range(60)]
            many = [clients.deliver_many("gw1", address, batches[n : n + 3], 5.0)
                    for n in range(30, 60, 3)]  # fmt: skip
            replies = await asyncio.gather(
                *(clients.deliver("gw1", address, batches[n], 5.0) for n in range(30)), *many
            )
            singles = replies[:30]
            flat = singles + [r for group in replies[30:] for r in group]  # type: ignore[union-attr]
            for n, reply in enumerate(flat):
                uid = uids[n % 3]
                assert isinstance(reply, gateway_pb2.DeliverReply)
                if uid == "nobody":
                    assert list(reply.missing) == ["nobody"] and not reply.delivered, n
                else:
                    assert list(reply.delivered) == [uid] and not reply.missing, n
            got = {"a": [], "b": []}  # type: dict[str, list[int]]
            for uid, ws in (("a", a), ("b", b)):
                for _ in range(20):
                    got[uid].append((await recv_json(ws))["content"]["n"])
                assert await nothing_more(ws, 0.1)
            assert sorted(got["a"]) == list(range(0, 60, 3))
            assert sorted(got["b"]) == list(range(1, 60, 3))
            assert clients.streams_opened == 1
            assert gw.deliver_service.open_streams == 1
            assert gw.deliver_service.calls == 40  # 30 single calls and 10 of three
            scrape = (await _scrape(gw)).decode()
            assert "imroute_gateway_delivery_streams 1.0" in scrape

            # A call the gateway refuses (a bad batch) fails alone; nothing of it is
            # written, and the stream goes on.
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
            assert clients.streams_opened == 1
        await clients.close()
        for _ in range(100):  # the gateway notices the stream's end
            if gw.deliver_service.open_streams == 0:
                break
            await asyncio.sleep(0.02)
        assert gw.deliver_service.open_streams == 0


async def _scrape(gw: Any) -> bytes:
    from socket_gateway.metrics import render

    return render(gw.metrics)


def gateway_argv(port: int, gid: str = "gws") -> list[str]:
    """A gateway process on a fixed gRPC port (the same port after a restart)."""
    return [str(BIN / "imroute"), "gateway", "--id", gid, "--group", "g1",
            "--ws-port", "0", "--grpc-port", str(port), "--heartbeat", "5"]  # fmt: skip


async def test_a_stopped_gateway_fails_calls_at_their_deadline_and_a_killed_one_at_once(
    redis_url: str, prefix: str, redis: object
) -> None:
    port = free_port_block([0])
    address = f"127.0.0.1:{port}"
    env = base_env(IMROUTE_REDIS_URL=redis_url, IMROUTE_REDIS_PREFIX=prefix, IMROUTE_SECRET=SECRET)
    clients = GrpcGatewayClients(close_grace_s=0.1, links=False)
    try:
        with running(gateway_argv(port), env) as proc:
            await asyncio.to_thread(read_until, proc, "ready")
            reply = await clients.deliver("gws", address, to_batch(message(1), ["x"], "b1"), 5.0)
            assert list(reply.missing) == ["x"]

            # Stopped (it reads and answers nothing): each call fails at its own
            # deadline, not sooner and not much later; the stream stays.
            proc.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(GatewayUnavailable) as late:
                await clients.deliver("gws", address, to_batch(message(2), ["x"], "b2"), 0.4)
            elapsed = time.monotonic() - started
            assert late.value.code == "DEADLINE_EXCEEDED" and 0.35 < elapsed < 1.5, elapsed
            proc.send_signal(signal.SIGCONT)
            reply = await clients.deliver("gws", address, to_batch(message(3), ["x"], "b3"), 5.0)
            assert list(reply.missing) == ["x"]
            assert clients.streams_opened == 1

            # Stopped again with calls waiting, then killed: every waiting call fails
            # with UNAVAILABLE at once (it may be retried), long before its deadline.
            proc.send_signal(signal.SIGSTOP)
            waiting = [
                asyncio.create_task(
                    clients.deliver("gws", address, to_batch(message(n), ["x"], f"b{n}"), 30.0)
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

        # Back at the same address: the next call opens a new stream and gets through.
        with running(gateway_argv(port), env) as proc:
            await asyncio.to_thread(read_until, proc, "ready")
            clients.reconnect(address)
            reply = await clients.deliver("gws", address, to_batch(message(9), ["x"], "b9"), 5.0)
            assert list(reply.missing) == ["x"]
            assert clients.streams_opened == 2
    finally:
        await clients.close()


class _UnaryOnly(GatewayServicer):
    """An older gateway: Deliver and DeliverMany, no DeliverStream."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def Deliver(self, request: Any, context: Any) -> gateway_pb2.DeliverReply:
        self.methods.append("Deliver")
        return gateway_pb2.DeliverReply(missing=request.uids)

    async def DeliverMany(self, request: Any, context: Any) -> gateway_pb2.DeliverManyReply:
        self.methods.append("DeliverMany")
        return gateway_pb2.DeliverManyReply(
            replies=[gateway_pb2.DeliverReply(connections=len(request.batches))]
            * len(request.batches)
        )


async def test_a_gateway_without_deliver_stream_gets_unary_calls() -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    servicer = _UnaryOnly()
    server = grpc.aio.server()
    add_GatewayServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    assert server.add_insecure_port(address) == port
    await server.start()
    clients = GrpcGatewayClients(links=False)  # the stream itself: no delivery link
    try:
        batches = [to_batch(message(n), [f"u{n}"], f"b{n}") for n in range(3)]
        replies = await clients.deliver_many("gw1", address, batches, 2.0)
        assert [r.connections for r in replies] == [3, 3, 3]
        reply = await clients.deliver("gw1", address, batches[0], 2.0)
        assert list(reply.missing) == ["u0"]
        # The stream was tried once; the calls that found out went unary, and so did the
        # next (no second stream).
        assert clients.streams_opened == 1
        assert servicer.methods == ["DeliverMany", "Deliver"]
    finally:
        await clients.close()
        await server.stop(0)
