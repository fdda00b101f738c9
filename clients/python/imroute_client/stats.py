"""Counters of what a client went through, for apps and tests to read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["ClientStats"]


@dataclass(slots=True)
class ClientStats:
    """Running totals of one client (never reset)."""

    messages: int = 0  # pushes handed to the app
    duplicates: int = 0  # pushes dropped: their msg_id was in the dedupe window
    connects: int = 0  # WebSocket handshakes that succeeded
    dispatches: int = 0  # gateways dispatch named
    avoided: int = 0  # dispatches that named a gateway it could not connect to (avoid=)
    same_retries: int = 0  # reconnects to the same gateway after a transport error
    moves: int = 0  # connections left for a drain (reconnect frame or 4503)
    refused: int = 0  # handshakes answered 503 or 429: full, draining, over a connect rate
    told: int = 0  # reconnect frames received
    user_cap: int = 0  # closes 4429 for the per-user cap: the user has too many connections
    transport_errors: int = 0  # failed connects and connections lost without a close
    bad_frames: int = 0  # frames that broke the protocol, skipped
    incomplete: int = 0  # recovered frames with complete:false
    acks_sent: int = 0  # ack frames written
    acked: int = 0  # pushes those frames acknowledged (dropped duplicates too)
    unacked_at_close: int = 0  # pushes no ack covered when their connection ended: resent
    held_forgotten: int = 0  # auto_ack off: unacked pushes forgotten past 1000 held
    dispatch_errors: Counter[str] = field(default_factory=Counter)  # by status or error
