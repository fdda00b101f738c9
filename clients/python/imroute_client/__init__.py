"""An asyncio client for imroute's socket gateways (see `ImrouteClient`)."""

from __future__ import annotations

from imroute_client.backoff import Backoff, retry_after
from imroute_client.client import ImrouteClient, OnIncomplete
from imroute_client.dedupe import DedupeWindow
from imroute_client.dispatch import Target
from imroute_client.errors import ClientError, DispatchRefused, ProtocolError, Unauthorized
from imroute_client.frames import Message, Reconnect, Recovered, Unknown, parse_frame
from imroute_client.stats import ClientStats
from imroute_client.store import FilePosStore, MemoryPosStore, PosStore
from imroute_client.urls import dispatch_url, resume_url, token_subprotocols, ws_connect_url

__all__ = [
    "Backoff",
    "ClientError",
    "ClientStats",
    "DedupeWindow",
    "DispatchRefused",
    "FilePosStore",
    "ImrouteClient",
    "MemoryPosStore",
    "Message",
    "OnIncomplete",
    "PosStore",
    "ProtocolError",
    "Reconnect",
    "Recovered",
    "Target",
    "Unauthorized",
    "Unknown",
    "dispatch_url",
    "parse_frame",
    "resume_url",
    "retry_after",
    "token_subprotocols",
    "ws_connect_url",
]
