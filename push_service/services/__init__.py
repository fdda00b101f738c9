"""The few service objects that route handlers call, one per resource.

Built once by `push_service.wiring` from the router's objects; each method does one
thing a handler needs, and raises from our error tree (`push_service.errors` renders it).
"""

from __future__ import annotations

from dataclasses import dataclass

from push_service.idempotency.http import Idempotency
from push_service.services.dispatch import Dispatch
from push_service.services.fanout import FanOut
from push_service.services.fleet import Fleet
from push_service.services.health import Health
from push_service.services.overview import Overview
from push_service.services.pushes import Pushed, Pushes, Receipts
from push_service.services.receipts import ReceiptsView
from push_service.services.users import Users
from router.webhook.base import EventSink

__all__ = [
    "Dispatch",
    "FanOut",
    "Fleet",
    "Health",
    "Overview",
    "Pushed",
    "Pushes",
    "Receipts",
    "ReceiptsView",
    "Services",
    "Users",
]


@dataclass(frozen=True, slots=True)
class Services:
    """What the lifespan puts in `app.state.services`; each handler gets one of them."""

    pushes: Pushes
    dispatch: Dispatch
    fleet: Fleet
    fanout: FanOut
    users: Users
    health: Health
    idempotency: Idempotency  # the Idempotency-Key of the push endpoints
    receipts: ReceiptsView  # GET /v1/pushes/{push_id} (any mode), /recipients
    overview: Overview  # GET /v1/admin/overview, what /dashboard shows
    # where webhook events are emitted (message.unacked); None: webhooks off
    webhooks: EventSink | None = None
