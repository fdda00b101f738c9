"""Internal calls are authenticated: the gateway's gRPC port takes no call without the
internal token (or an mTLS cert), and no batch that could forge a frame, from anyone.
Real gateways, real gRPC, real WebSocket clients."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from router.bus.base import BROADCAST
from router.bus.factory import bus_from_settings
from router.gateway_rpc.client import GrpcGatewayClients
from router.processes.ports import free_port
from router.testing import deliver_one
from shared.batches import to_batch
from shared.clock import SystemClock
from shared.errors import ConfigError, GatewayUnavailable
from shared.internal_auth import TlsFiles, load_tls
from shared.models import Message
from shared.proto import gateway_pb2
from shared.proto.gateway_service import GatewayStub
from socket_gateway.app import Gateway
from socket_gateway.metrics import render
from tests.conftest import SECRET
from tests.integration.gateway_calls import TOKEN, tls_settings
from tests.integration.procs import gateway_env
from tests.integration.stack import AUTH, api, client, gateway, nothing_more, recv_json, settings
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

OTHER = "another-token-0123456789abcdef-01234"
ROOT = Path(__file__).resolve().parents[2]


def message(content: bytes = b'{"n":1}', msg_id: str = "m1") -> Message:
    return Message(msg_id, "p1", 0, "admin", content, SystemClock().now_ms())


def batch(uids: list[str], content: bytes = b'{"n":1}', bid: str = "b1") -> gateway_pb2.Batch:
    return to_batch(message(content, "m-" + bid), uids, bid)


@asynccontextmanager
async def raw_stub(address: str) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(address) as channel:
        yield GatewayStub(channel)


async def test_no_call_without_the_token(redis_url: str, prefix: str) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1", internal_token=TOKEN) as gw:
        address = f"127.0.0.1:{gw.grpc_port}"
        async with client(gw, "alice") as ws:
            # A stranger on the port: no metadata, a wrong token, a token without Bearer.
            async with raw_stub(address) as stub:
                for metadata in (None, (("authorization", f"Bearer {OTHER}"),),
                                 (("authorization", TOKEN),)):  # fmt: skip
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.DeliverMany(
                            gateway_pb2.DeliverManyRequest(batches=[batch(["alice"])]),
                            timeout=2,
                            metadata=metadata,
                        )
                    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
                    assert "IMROUTE_INTERNAL_TOKEN" in (refused.value.details() or "")
                everyone = batch([], bid="b-all")
                everyone.everyone = True
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.DeliverMany(
                        gateway_pb2.DeliverManyRequest(batches=[everyone]), timeout=2
                    )
            assert gw.token_check is not None and gw.token_check.refused == 4
            scraped = render(gw.metrics).decode()
            assert "imroute_gateway_unauthenticated_calls_total 4.0" in scraped
            assert gw.deliver_service.batches == 0  # nothing reached the delivery core
            assert await nothing_more(ws, 0.2)

            wrong = GrpcGatewayClients(token=OTHER)
            with pytest.raises(GatewayUnavailable) as failed:
                await deliver_one(wrong, "gw1", address, batch(["alice"], bid="b2"), 2.0)
            assert failed.value.code == "UNAUTHENTICATED"
            await wrong.close()

            right = GrpcGatewayClients(token=TOKEN)
            reply = await deliver_one(right, "gw1", address, batch(["alice"], bid="b3"), 2.0)
            assert list(reply.delivered) == ["alice"]
            assert (await recv_json(ws))["content"] == {"n": 1}
            await right.close()


async def test_a_push_through_the_push_service_carries_the_token(
    redis_url: str, prefix: str
) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", internal_token=TOKEN) as gw,
        client(gw, "alice") as ws,
    ):
        async with api(redis_url, prefix, internal_token=TOKEN) as http:
            resp = await http.post("/v1/push", json={"to": ["alice"], "content": 1}, headers=AUTH)
            assert resp.json()["delivered"] == ["alice"], resp.text
            assert (await recv_json(ws))["content"] == 1
        # A push service with another token is refused, says so, and writes nothing.
        async with api(redis_url, prefix, internal_token=OTHER) as http:
            body = {"to": ["alice"], "content": 2, "store": False}
            resp = await http.post("/v1/push", json=body, headers=AUTH)
            out = resp.json()
            assert out["failed"] == ["alice"], out
            assert out["errors"][0]["error"].startswith("UNAUTHENTICATED"), out
            assert await nothing_more(ws, 0.2)


FORGED = [
    # The finding: content that closes its value and adds keys to the frame.
    (b'null,"type":"reconnect"', "not one JSON value"),
    (b'1}{"type":"push"', "not one JSON value"),
    (b"NaN", "not one JSON value"),
    (b'"\xff"', "not one JSON value"),  # not UTF-8
    ('"é"'.encode("utf-16"), "not one JSON value"),  # JSON, but not UTF-8
    (b"", "not one JSON value"),
    (b"[" * 100_000 + b"]" * 100_000, "content_json is 200000 bytes"),
]


@pytest.mark.parametrize(("content", "why"), FORGED)
async def test_a_forged_content_is_refused_whole(
    redis_url: str, prefix: str, content: bytes, why: str
) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1", internal_token=TOKEN) as gw:
        address = f"127.0.0.1:{gw.grpc_port}"
        rpc = GrpcGatewayClients(token=TOKEN)
        async with client(gw, "alice") as ws:
            with pytest.raises(GatewayUnavailable) as refused:
                await deliver_one(rpc, "gw1", address, batch(["alice"], content), 2.0)
            assert refused.value.code == "INVALID_ARGUMENT"
            assert why in refused.value.reason
            # One bad batch in a DeliverMany: none of the call is written.
            good = batch(["alice"], bid="good")
            bad = batch(["alice"], content, bid="bad")
            with pytest.raises(GatewayUnavailable) as refused:
                await rpc.deliver_many("gw1", address, [good, bad], 2.0)
            assert "batch 1:" in refused.value.reason
            assert await nothing_more(ws, 0.2)
            assert gw.deliver_service.rejected.total == 2
            assert "imroute_gateway_rejected_batches_total 2.0" in render(gw.metrics).decode()
        await rpc.close()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda b: setattr(b, "batch_id", "x" * (16 << 10)), "batch_id over 128"),
        (lambda b: b.uids.extend(["u"] * 10_001), "at most 10000 per batch"),
        (lambda b: b.uids.append("u" * 129), "a uid over 128"),
        (lambda b: b.seqs.extend([1, 2]), "seqs must be empty or one per uid"),
        (lambda b: setattr(b.message, "msg_id", ""), "msg_id and push_id"),
    ],
)
async def test_ids_and_counts_are_capped(
    redis_url: str, prefix: str, change: Any, why: str
) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        rpc = GrpcGatewayClients()
        bad = batch(["alice"])
        change(bad)
        with pytest.raises(GatewayUnavailable) as refused:
            await deliver_one(rpc, "gw1", f"127.0.0.1:{gw.grpc_port}", bad, 2.0)
        assert refused.value.code == "INVALID_ARGUMENT" and why in refused.value.reason
        assert gw.deliver_service.rejected.total == 1 and len(gw.deliver_service._recent) == 0
        await rpc.close()


async def test_a_forged_batch_on_the_bus_is_dropped_counted_and_the_next_delivered(
    redis_url: str, prefix: str
) -> None:
    s = settings(redis_url, prefix)
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "alice") as ws:
        async with bus_from_settings(s) as bus:
            forged = batch([], b'null,"type":"reconnect"', bid="forged")
            forged.everyone, forged.mode = True, gateway_pb2.MODE_BROADCAST
            fine = batch([], b'{"ok":true}', bid="fine")
            fine.everyone, fine.mode = True, gateway_pb2.MODE_BROADCAST
            await bus.publish(BROADCAST, forged.SerializeToString())
            await bus.publish(BROADCAST, fine.SerializeToString())
            frame = await recv_json(ws)
            assert frame["type"] == "push" and frame["content"] == {"ok": True}, frame
            await wait_for(lambda: gw.deliver_service.rejected.total == 1, "the count")


async def test_mutual_tls(redis_url: str, prefix: str, certs: tuple[Path, Path]) -> None:
    ours, theirs = certs
    async with gateway(redis_url, prefix, "gw1", "g1", **tls_settings(ours)) as gw:
        address = f"127.0.0.1:{gw.grpc_port}"
        async with client(gw, "alice") as ws:
            # The name in the cert, not the IP dialled (how a fleet of pods shares one cert).
            tls = load_tls(settings(redis_url, prefix, **tls_settings(ours, "imroute-gateway")))
            assert tls is not None and "BEGIN" not in repr(tls)  # the key is never shown
            rpc = GrpcGatewayClients(tls=tls)
            reply = await deliver_one(rpc, "gw1", address, batch(["alice"]), 2.0)
            assert list(reply.delivered) == ["alice"]
            assert (await recv_json(ws))["content"] == {"n": 1}
            await rpc.close()

            # No cert (plain text), and a cert another CA signed: no call gets through.
            other_ca = load_tls(settings(redis_url, prefix, **tls_settings(theirs)))
            strangers = [GrpcGatewayClients(), GrpcGatewayClients(tls=other_ca)]
            # A server cert our CA signed, but a client cert it did not: refused too.
            mixed = load_tls(settings(redis_url, prefix, **tls_settings(theirs)))
            assert mixed is not None and tls is not None
            strangers.append(GrpcGatewayClients(tls=TlsFiles(mixed.cert, mixed.key, tls.ca)))
            for n, rpc in enumerate(strangers):
                with pytest.raises(GatewayUnavailable) as refused:
                    await deliver_one(rpc, "gw1", address, batch(["alice"], bid=f"s{n}"), 1.0)
                assert refused.value.code == "UNAVAILABLE", refused.value.reason
                await rpc.close()
            assert await nothing_more(ws, 0.2)


def test_bad_internal_settings_are_named(tmp_path: Path) -> None:
    base = {"redis_url": "redis://127.0.0.1:6379/0", "secret": SECRET}
    with pytest.raises(ConfigError, match=r"IMROUTE_INTERNAL_TOKEN: .*at least 32"):
        settings("redis://127.0.0.1:6379/0", "p:", internal_token="short")
    with pytest.raises(ConfigError, match="IMROUTE_GRPC_TLS_KEY, IMROUTE_GRPC_TLS_CA not set"):
        settings("redis://127.0.0.1:6379/0", "p:", grpc_tls_cert=str(tmp_path / "x.pem"))
    missing = tls_settings(tmp_path)
    with pytest.raises(ConfigError, match="IMROUTE_GRPC_TLS_CERT: cannot read"):
        Gateway(settings(base["redis_url"], "p:", **missing))
    (tmp_path / "node.pem").write_text("not a cert")
    with pytest.raises(ConfigError, match=r"IMROUTE_GRPC_TLS_CERT: .* is not a PEM file"):
        Gateway(settings(base["redis_url"], "p:", **missing))
    # Beyond loopback, a gateway needs a credential.
    with pytest.raises(ConfigError, match=r"IMROUTE_INTERNAL_TOKEN: required .*0.0.0.0"):
        Gateway(settings(base["redis_url"], "p:", grpc_host="0.0.0.0"))
    # (an advertise host, so the host's own addresses cannot make it refuse to start)
    Gateway(
        settings(
            base["redis_url"],
            "p:",
            grpc_host="0.0.0.0",
            internal_token=TOKEN,
            advertise_host="10.0.0.1",
        )
    )
    Gateway(settings(base["redis_url"], "p:", grpc_host="::1"))


async def test_a_gateway_process_on_an_open_address_without_a_token_refuses_to_start(
    redis_url: str, prefix: str
) -> None:
    env = gateway_env(
        redis_url,
        prefix,
        IMROUTE_GRPC_HOST="0.0.0.0",
        IMROUTE_GRPC_PORT=str(free_port()),
        IMROUTE_WS_PORT=str(free_port()),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "socket_gateway", env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:  # it started after all: never leave it running
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2, (out, err)
    assert b"IMROUTE_INTERNAL_TOKEN: required" in err, err
