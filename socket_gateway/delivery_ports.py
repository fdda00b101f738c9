"""The gateway's two ways in for delivery calls, started together: the gRPC server and,
unless it is off, the delivery link (socket_gateway.link_server) on the same host."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

import grpc.aio

from shared.clock import Clock
from shared.internal_auth import TlsFiles
from shared.proto import gateway_pb2
from shared.settings import GatewaySettings
from shared.tls_context import server_context
from socket_gateway.delivery import DeliverService
from socket_gateway.grpc_server import MAX_RECEIVE_BYTES, GatewayServicer, start_grpc_server
from socket_gateway.link_server import LinkServer, Tickets, call_answerer

__all__ = ["DeliveryPorts", "open_delivery_ports"]


@dataclass(frozen=True, slots=True)
class DeliveryPorts:
    grpc: grpc.aio.Server
    grpc_port: int
    link: LinkServer | None  # None: the link is off


async def open_delivery_ports(
    stack: AsyncExitStack,
    service: DeliverService,
    settings: GatewaySettings,
    interceptors: Sequence[grpc.aio.ServerInterceptor],
    tls: TlsFiles | None,
    clock: Clock,
    offer_link: bool,
) -> DeliveryPorts:
    """Start both, each closed with `stack`."""
    servicer = GatewayServicer(service)
    link: LinkServer | None = None
    if offer_link and settings.delivery_link:
        tickets = Tickets(clock)
        link = LinkServer(call_answerer(service), tickets, clock, MAX_RECEIVE_BYTES, service.links)
        context = None if tls is None else server_context(tls)
        port = await link.start(settings.grpc_host, settings.link_port, context)
        stack.push_async_callback(link.close)
        gateway_id = settings.gateway_id

        def offer() -> gateway_pb2.LinkReply:
            return gateway_pb2.LinkReply(port=port, ticket=tickets.issue(), gateway_id=gateway_id)

        servicer.offer = offer
    server, grpc_port = await start_grpc_server(
        servicer, settings.grpc_host, settings.grpc_port, interceptors, tls
    )
    stack.push_async_callback(server.stop, 5)
    return DeliveryPorts(server, grpc_port, link)
