"""Dispatch: which gateway a connecting client should open its WebSocket on."""

from __future__ import annotations

import math
from collections.abc import Sequence

from push_service.errors import Unavailable
from router.balancing import GatewayState, NoEligibleGateway
from router.fleet.dispatch import Dispatcher
from shared.auth import TokenRules, verify_token
from shared.clock import Clock
from shared.errors import InvalidInput
from shared.keys import ID_PATTERN

__all__ = ["MAX_AVOID", "Dispatch", "parse_avoid"]

# Gateway ids one request may name in `avoid` (a client names the one it failed on).
MAX_AVOID = 8


def parse_avoid(values: Sequence[str]) -> frozenset[str]:
    """The gateway ids of `?avoid=` (repeated, or comma-separated, or both); InvalidInput
    for a malformed id or more than MAX_AVOID of them."""
    ids = [part for value in values for part in value.split(",")]
    if len(ids) > MAX_AVOID:
        raise InvalidInput("avoid", f"names {len(ids)} gateways; at most {MAX_AVOID}")
    for gateway_id in ids:
        if not ID_PATTERN.fullmatch(gateway_id):
            raise InvalidInput(
                "avoid",
                f"{gateway_id[:70]!r} is not a gateway id (1-64 characters of letters, "
                "digits, '_', '.' or '-')",
            )
    return frozenset(ids)


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

    async def choose(
        self, token: str | None, zone: str | None, avoid: Sequence[str] = ()
    ) -> GatewayState:
        """The gateway for the token's user, not one of `avoid` (`?avoid=` values: the
        gateways it could not connect to) unless no other fits; AuthError, InvalidInput
        for a bad `avoid`, or Unavailable when none fits."""
        if self._secret is None:
            raise Unavailable("dispatch needs IMROUTE_SECRET to check tokens")
        uid = verify_token(self._secret, token, self._clock, self._token_rules)
        avoided = parse_avoid(avoid)
        try:
            return await self._dispatcher.choose(uid, zone, avoided)
        except NoEligibleGateway as exc:
            raise Unavailable(exc.reason, retry_after_s=self._retry_after_s) from None
