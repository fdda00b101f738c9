"""Dispatch: which gateway a connecting client should open its WebSocket on."""

from __future__ import annotations

import math

from push_service.errors import Unavailable
from router.balancing import GatewayState, NoEligibleGateway
from router.fleet.dispatch import Dispatcher
from shared.auth import TokenRules, verify_token
from shared.clock import Clock

__all__ = ["Dispatch"]


class Dispatch:
    """Checks the client's token, then places it by the configured rule."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        secret: str | None,
        clock: Clock,
        gateway_cache_s: float,
        token_rules: TokenRules | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._secret = secret
        self._clock = clock
        # The gateways' rules (IMROUTE_JWT_*): dispatch accepts the tokens they accept.
        self._token_rules = token_rules or TokenRules()
        # The fleet is read again after IMROUTE_GATEWAY_CACHE_S: try after that.
        self._retry_after_s = max(1, math.ceil(gateway_cache_s))

    async def choose(self, token: str | None, zone: str | None) -> GatewayState:
        """The gateway for the token's user; AuthError, or Unavailable when none fits."""
        if self._secret is None:
            raise Unavailable("dispatch needs IMROUTE_SECRET to check tokens")
        uid = verify_token(self._secret, token, self._clock, self._token_rules)
        try:
            return await self._dispatcher.choose(uid, zone)
        except NoEligibleGateway as exc:
            raise Unavailable(exc.reason, retry_after_s=self._retry_after_s) from None
