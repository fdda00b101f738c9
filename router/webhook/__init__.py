"""Webhooks for offline fallback: events to the app's own server.

`base` is the seam (`Event`, `EventSink`); `outbox` the fleet's bounded Redis Stream
producers emit into; `sender` the task in every push service that delivers it, signed
as `signing` says; `presence` and `sweeper` produce user.offline and user.online.
"""

from __future__ import annotations

from router.webhook.base import Event, EventSink, encode_event, events_body
from router.webhook.signing import HEADER, SignatureError, sign, verify

__all__ = [
    "HEADER",
    "Event",
    "EventSink",
    "SignatureError",
    "encode_event",
    "events_body",
    "sign",
    "verify",
]
