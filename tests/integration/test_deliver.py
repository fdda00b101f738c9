"""The gateway's delivery semantics over real gRPC: everyone, expiry and duplicates; and
the client's channel to a gateway that restarted at the same address."""

from __future__ import annotations

import time
from typing import Any

import grpc
import grpc.aio
import pytest

from router.gateway_rpc.client import GrpcGatewayClients
from router.processes.ports import free_port
from router.testing import deliver_one
from shared.batches import to_batch
from shared.clock import SystemClock
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2
from shared.proto.gateway_service import GatewayServicer, add_GatewayServicer_to_server
from tests.integration.gateway_calls import message
from tests.integration.stack import client, gateway, nothing_more, recv_json

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("redis")
async def test_everyone_duplicate_and_expired_batches(redis_url: str, prefix: str) -> None:
    clients = GrpcGatewayClients()
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        address = f"127.0.0.1:{gw.grpc_port}"
        async with client(gw, "a") as a1, client(gw, "a") as a2, client(gw, "b") as b:
            everyone = to_batch(message(1), [], "batch-1")
            everyone.everyone = True
            everyone.mode = gateway_pb2.MODE_BROADCAST
            reply = await deliver_one(clients, "gw1", address, everyone, 2.0)
            assert reply.connections == 3 and not reply.duplicate
            for ws in (a1, a2, b):
                assert (await recv_json(ws))["content"] == {"n": 1}

            # The same batch again (a bus redelivery, a hedged duplicate): written once.
            again = await deliver_one(clients, "gw1", address, everyone, 2.0)
            assert again.duplicate and again.connections == 0
            for ws in (a1, a2, b):
                assert await nothing_more(ws, 0.1)

            late = to_batch(message(2), ["a", "b"], "batch-2")
            late.expires_ms = SystemClock().now_ms() - 1
            dropped = await deliver_one(clients, "gw1", address, late, 2.0)
            assert dropped.expired and list(dropped.delivered) == []
            assert await nothing_more(b, 0.1)

            fresh = to_batch(message(3), ["b", "nobody"], "batch-3")
            fresh.expires_ms = SystemClock().now_ms() + 60_000
            ok = await deliver_one(clients, "gw1", address, fresh, 2.0)
            assert list(ok.delivered) == ["b"] and list(ok.missing) == ["nobody"]
            assert (await recv_json(b))["content"] == {"n": 3}
            assert await nothing_more(a1, 0.1)
        stats = gw.deliver_service
        assert (stats.batches, stats.duplicates, stats.expired) == (4, 1, 1)
    await clients.close()


class _Answering(GatewayServicer):
    async def DeliverMany(self, request: Any, context: Any) -> gateway_pb2.DeliverManyReply:
        return gateway_pb2.DeliverManyReply(
            replies=[gateway_pb2.DeliverReply(connections=1)] * len(request.batches)
        )


async def _serve(port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    add_GatewayServicer_to_server(_Answering(), server)
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    return server


async def test_a_restarted_gateway_is_reached_on_a_new_channel_at_once() -> None:
    """After a crash the old channel fails fast for up to its reconnect backoff (1 s)
    even once the gateway is back; `reconnect` (on a new start time) skips that wait."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    clients = GrpcGatewayClients(close_grace_s=0.1)
    batch = to_batch(message(1), ["a"], "batch-1")
    server = await _serve(port)
    try:
        assert (await deliver_one(clients, "gw1", address, batch, 2.0)).connections == 1
        await server.stop(0)
        for _ in range(12):  # the channel sees the refusals and backs off
            with pytest.raises(GatewayUnavailable):
                await deliver_one(clients, "gw1", address, batch, 0.5)
        server = await _serve(port)
        clients.reconnect(address)
        started = time.monotonic()
        for _ in range(5):
            assert (await deliver_one(clients, "gw1", address, batch, 2.0)).connections == 1
        assert time.monotonic() - started < 0.5
        assert len(clients) == 1
    finally:
        await server.stop(0)
        await clients.close()
