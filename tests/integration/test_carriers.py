"""The router's two carriers to a gateway, the same scenarios on each: the delivery link
(docs/architecture/gateway-calls.md) and the unary gRPC DeliverMany it falls back to. Many
concurrent calls each get their own reply; a refused call fails alone; a stopped
gateway fails a call at its deadline and the carrier survives; a killed one fails every
waiting call at once; back at the same address, it is reached again. Real gateway
processes are stopped with SIGSTOP and killed with SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from router.gateway_rpc.client import GrpcGatewayClients
from router.processes.ports import free_port_block
from router.testing import deliver_one
from shared.batches import to_batch
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2
from socket_gateway.metrics import render
from tests.integration.gateway_calls import linked, message
from tests.integration.procs import BIN, gateway_env, read_until, running
from tests.integration.stack import client, gateway, nothing_more, recv_json
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

LINK = "link"
DELIVER_MANY = "DeliverMany"


@pytest.fixture(params=[LINK, DELIVER_MANY])
def carrier(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def clients_for(carrier: str, **kw: float) -> GrpcGatewayClients:
    """A client whose calls take `carrier` (once `ready`)."""
    return GrpcGatewayClients(links=carrier == LINK, **kw)


async def ready(carrier: str, clients: GrpcGatewayClients, gid: str, address: str) -> None:
    """Until the calls take `carrier`: the link opens in the background, as calls come."""
    if carrier == LINK:
        await linked(clients, gid, address)


def gateway_argv(port: int, gid: str = "gws") -> list[str]:
    """A gateway process on a fixed gRPC port (the same port after a restart)."""
    return [str(BIN / "imroute"), "gateway", "--id", gid, "--group", "g1",
            "--ws-port", "0", "--grpc-port", str(port), "--heartbeat", "5"]  # fmt: skip


async def test_concurrent_calls_each_get_their_own_reply_and_a_refused_one_fails_alone(
    carrier: str, redis_url: str, prefix: str
) -> None:
    clients = clients_for(carrier)
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        assert gw.ports is not None and gw.ports.link is not None
        address = f"127.0.0.1:{gw.grpc_port}"
        async with client(gw, "a") as a, client(gw, "b") as b:
            await ready(carrier, clients, "gw1", address)
            links = gw.deliver_service.links
            assert links.open == (1 if carrier == LINK else 0) and links.calls == 0
            before = gw.deliver_service.calls  # the link's first calls went over gRPC
            uids = ["a", "b", "nobody"]
            batches = [to_batch(message(n), [uids[n % 3]], f"batch-{n}") for n in range(60)]
            many = [clients.deliver_many("gw1", address, batches[n : n + 3], 5.0)
                    for n in range(30, 60, 3)]  # fmt: skip
            replies = await asyncio.gather(
                *(deliver_one(clients, "gw1", address, batches[n], 5.0) for n in range(30)), *many
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
            # 30 single calls and 10 of three, on the carrier
            assert gw.deliver_service.calls == before + 40
            assert links.calls == (40 if carrier == LINK else 0)
            scrape = render(gw.metrics).decode()
            assert f"imroute_gateway_delivery_links {links.open}.0" in scrape

            # A call the gateway refuses (a bad batch) fails alone; nothing of it is
            # written, and the carrier goes on.
            good = to_batch(message(100), ["a"], "batch-100")
            bad = to_batch(message(101), ["b"], "batch-101")
            bad.seqs.extend([1, 2])  # two seqs for one uid
            with pytest.raises(GatewayUnavailable) as refused:
                await clients.deliver_many("gw1", address, [good, bad], 5.0)
            assert refused.value.code == "INVALID_ARGUMENT"
            assert "batch 1: seqs must be empty or one per uid" in refused.value.reason
            assert await nothing_more(a, 0.2) and await nothing_more(b, 0.1)
            again = await deliver_one(clients, "gw1", address, good, 5.0)
            assert list(again.delivered) == ["a"]
            assert (await recv_json(a))["content"] == {"n": 100}
            assert gw.deliver_service.calls == before + 42
            if carrier == LINK:
                assert clients.links_opened == 1 and links.calls == 42
            else:
                assert clients.links_opened == 0 and links.calls == 0
        await clients.close()
        await wait_for(lambda: gw.deliver_service.links.open == 0, "the link's end")


async def test_a_stopped_gateway_fails_calls_at_their_deadline_and_a_killed_one_at_once(
    carrier: str, redis_url: str, prefix: str
) -> None:
    port = free_port_block([0])
    address = f"127.0.0.1:{port}"
    env = gateway_env(redis_url, prefix)
    clients = clients_for(carrier, close_grace_s=0.1)
    opened = 1 if carrier == LINK else 0
    try:
        with running(gateway_argv(port), env) as proc:
            await asyncio.to_thread(read_until, proc, "ready")
            reply = await deliver_one(
                clients, "gws", address, to_batch(message(1), ["x"], "b1"), 5.0
            )
            assert list(reply.missing) == ["x"]
            await ready(carrier, clients, "gws", address)

            # Stopped (it reads and answers nothing): each call fails at its own
            # deadline, not sooner and not much later; the carrier stays.
            proc.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(GatewayUnavailable) as late:
                await deliver_one(clients, "gws", address, to_batch(message(2), ["x"], "b2"), 0.4)
            elapsed = time.monotonic() - started
            assert late.value.code == "DEADLINE_EXCEEDED" and 0.35 < elapsed < 1.5, elapsed
            proc.send_signal(signal.SIGCONT)
            reply = await deliver_one(
                clients, "gws", address, to_batch(message(3), ["x"], "b3"), 5.0
            )
            assert list(reply.missing) == ["x"]
            assert clients.links_opened == opened and len(clients) == 1

            # Stopped again with calls waiting, then killed: every waiting call fails
            # with UNAVAILABLE at once (it may be retried), long before its deadline.
            proc.send_signal(signal.SIGSTOP)
            waiting = [
                asyncio.create_task(
                    deliver_one(clients, "gws", address, to_batch(message(n), ["x"], f"b{n}"), 30.0)
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

        # Back at the same address: the next call gets through (over gRPC, and a new
        # link opens).
        with running(gateway_argv(port), env) as proc:
            await asyncio.to_thread(read_until, proc, "ready")
            clients.reconnect(address)
            reply = await deliver_one(
                clients, "gws", address, to_batch(message(9), ["x"], "b9"), 5.0
            )
            assert list(reply.missing) == ["x"]
            await wait_for(lambda: clients.links_opened == 2 * opened, "a new link")
            reply = await deliver_one(
                clients, "gws", address, to_batch(message(10), ["x"], "b10"), 5.0
            )
            assert list(reply.missing) == ["x"]
    finally:
        await clients.close()
