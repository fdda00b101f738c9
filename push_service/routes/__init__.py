"""The HTTP API, one module per resource; each handler binds the request, calls one
method of one service (`push_service.services`) and renders the answer.

- `push`: POST /v1/push (P2P).
- `users`: a user's live routes, and the directory's bulk upsert and delete.
- `gateways`: the live fleet, and drain requests.
- `dispatch`: which gateway a connecting client should use.
- `groups`: broadcast and multicast, started as background jobs.
- `jobs`: a broadcast or multicast job's status.
- `health`: /healthz and /metrics.
- `admin`: the dashboard's overview (admin key).
"""

from __future__ import annotations

from fastapi import APIRouter

from push_service.routes import admin, dispatch, gateways, groups, health, jobs, push, users

__all__ = ["ROUTERS"]

# In the order the OpenAPI document lists them.
ROUTERS: tuple[APIRouter, ...] = (
    push.router,
    users.router,
    gateways.router,
    groups.router,
    jobs.router,
    dispatch.router,
    health.router,
    admin.router,
)
