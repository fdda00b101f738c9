"""Socket gateway: holds client WebSockets, writes pushes to them, serves Deliver over gRPC."""

from __future__ import annotations

from socket_gateway.app import Gateway
from socket_gateway.connections import ClientConn, LocalConnections

__all__ = ["ClientConn", "Gateway", "LocalConnections"]
