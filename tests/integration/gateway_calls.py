"""Calling a gateway directly, as a push service does: a message and its batches, a
delivery link made to open and used, a stranger on the link's port, and the internal
credentials (the token, mTLS settings; the `certs` fixture is in conftest)."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path
from typing import Any

import grpc.aio
from websockets.asyncio.client import ClientConnection

from router.gateway_rpc.client import GrpcGatewayClients
from router.testing import deliver_one
from shared.batches import to_batch
from shared.clock import SystemClock
from shared.internal_auth import TlsFiles
from shared.link_frames import FrameReader, frame
from shared.models import Message
from shared.proto import gateway_pb2
from shared.proto.gateway_service import GatewayStub
from socket_gateway.app import Gateway
from tests.integration.stack import recv_json

__all__ = [
    "TOKEN",
    "Raw",
    "ask_ticket",
    "delivered_over_a_link",
    "hello",
    "linked",
    "message",
    "stranger",
    "tls_settings",
]

# The internal token of the tests that set one.
TOKEN = "internal-token-0123456789abcdef-0123"


def message(n: int = 1) -> Message:
    """Push `n`: ids m<n> and p<n>, content {"n": n}, sent now."""
    return Message(f"m{n}", f"p{n}", 0, "admin", b'{"n":%d}' % n, SystemClock().now_ms())


async def linked(clients: GrpcGatewayClients, gid: str, address: str, opened: int = 1) -> None:
    """Make calls (over gRPC, until then) until `opened` links have been opened: a link
    is opened, or tried again, when a call finds none."""
    deadline = time.monotonic() + 5.0
    n = 0
    while clients.links_opened < opened:
        assert time.monotonic() < deadline, "timed out waiting for the delivery link"
        n += 1
        batch = to_batch(message(0), ["nobody"], f"warm-{opened}-{n}")
        await deliver_one(clients, gid, address, batch, 5.0)
        await asyncio.sleep(0.02)


async def delivered_over_a_link(
    gw: Gateway, gid: str, ws: ClientConnection, n: int, batch_id: str, token: str | None = None
) -> None:
    """A router (its internal `token`) gets a link to `gw`, known as `gid`, and delivers
    push `n` over it to the client `ws` of uid "a"."""
    clients = GrpcGatewayClients(token=token)
    try:
        address = f"127.0.0.1:{gw.grpc_port}"
        await linked(clients, gid, address)
        reply = await deliver_one(clients, gid, address, to_batch(message(n), ["a"], batch_id), 5.0)
        assert list(reply.delivered) == ["a"]
        assert (await recv_json(ws))["content"] == {"n": n}
    finally:
        await clients.close()


class Raw(asyncio.Protocol):
    """A stranger's socket: what the gateway answers, and when it closes."""

    def __init__(self) -> None:
        self.reader = FrameReader(1 << 20)
        self.replies: list[gateway_pb2.StreamReply] = []
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.replies += [gateway_pb2.StreamReply.FromString(f) for f in self.reader.feed(data)]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set_result(None)


async def stranger(port: int, *sends: bytes, tls: ssl.SSLContext | None = None) -> Raw:
    loop = asyncio.get_running_loop()
    transport, raw = await loop.create_connection(Raw, "127.0.0.1", port, ssl=tls)
    for data in sends:
        transport.write(data)
    await asyncio.wait_for(raw.closed, 10)
    return raw


def hello(ticket: bytes) -> bytes:
    return frame(gateway_pb2.LinkHello(ticket=ticket).SerializeToString())


async def ask_ticket(gw: Gateway, tls: TlsFiles | None = None) -> gateway_pb2.LinkReply:
    """The gateway's answer to `Link`, asked in plain text or with `tls` (mTLS)."""
    address = f"127.0.0.1:{gw.grpc_port}"
    if tls is None:
        channel = grpc.aio.insecure_channel(address)
    else:
        credentials = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)
        options = [("grpc.ssl_target_name_override", "imroute-gateway")]
        channel = grpc.aio.secure_channel(address, credentials, options)
    async with channel:
        rpc: Any = GatewayStub(channel)
        reply: gateway_pb2.LinkReply = await rpc.Link(gateway_pb2.LinkRequest(), timeout=2)
        return reply


def tls_settings(folder: Path, server_name: str | None = None) -> dict[str, Any]:
    return {
        "grpc_tls_cert": str(folder / "node.pem"),
        "grpc_tls_key": str(folder / "node.key"),
        "grpc_tls_ca": str(folder / "ca.pem"),
        "grpc_tls_server_name": server_name,
    }
