"""The delivery link's settings, a mixin of `shared.settings.Settings` (read as
`IMROUTE_*` like any other field). README, "The delivery link"."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

__all__ = ["LinkSettings"]


class LinkSettings(BaseSettings):
    # gateway: offer the link; push service: use the links gateways offer. Off on
    # either side: every delivery call goes over gRPC (DeliverMany)
    delivery_link: bool = True
    # gateway: the link's port, on IMROUTE_GRPC_HOST; 0: any free port (routers learn
    # it from the gRPC Link method, so nothing needs to know it in advance)
    link_port: int = Field(0, ge=0, le=65535)
