"""Request and response bodies of the HTTP API (pydantic lives at the HTTP edge only)."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    field_validator,
)

from shared.auth import valid_uid

__all__ = [
    "MAX_CONTENT_BYTES",
    "MAX_RECIPIENTS",
    "GatewayError",
    "GatewayOut",
    "GatewaysOut",
    "PushIn",
    "PushOut",
    "RouteOut",
    "UserRouteOut",
]

MAX_RECIPIENTS = 1000
MAX_CONTENT_BYTES = 64 * 1024


def _check_uid(uid: str) -> str:
    if not valid_uid(uid):
        raise ValueError("must be 1-128 characters of valid Unicode")
    return uid


Uid = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(_check_uid)]


class PushIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    to: list[Uid] = Field(min_length=1, max_length=MAX_RECIPIENTS)
    content: JsonValue
    msg_type: int = Field(0, ge=0, le=2**31 - 1)
    sender: str = Field("admin", alias="from", min_length=1, max_length=128)

    @field_validator("to")
    @classmethod
    def _unique(cls, to: list[str]) -> list[str]:
        if len(set(to)) != len(to):
            raise ValueError("uids must be unique")
        return to


class GatewayError(BaseModel):
    gateway_id: str
    error: str


class PushOut(BaseModel):
    push_id: str
    msg_id: str
    delivered: list[str]
    offline: list[str]
    failed: list[str] = Field(
        description="recipients with routes whose every gateway failed: not delivered"
    )
    errors: list[GatewayError]


class RouteOut(BaseModel):
    gateway_id: str
    group_id: str
    ip: str
    port: int


class UserRouteOut(BaseModel):
    uid: str
    online: bool
    routes: list[RouteOut]


class GatewayOut(BaseModel):
    gateway_id: str
    group_id: str
    ws_url: str
    grpc_address: str
    connections: int


class GatewaysOut(BaseModel):
    gateways: list[GatewayOut]
