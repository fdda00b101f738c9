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
from shared.http_heads import HeadLimits
from shared.keys import ID_PATTERN

__all__ = ["MAX_AVOID", "TOKEN_TARGET", "Dispatch", "check_token_fits", "parse_avoid"]

# Gateway ids one request may name in `avoid` (a client names the one it failed on).
MAX_AVOID = 8
# What a client's request target at a gateway holds before its token (the gateway serves
# /ws only, whatever path a proxy in front of it shows).
TOKEN_TARGET = "/ws?token="


def check_token_fits(token: str, limits: HeadLimits) -> None:
    """InvalidInput when `token` would make the gateway's URL longer than the gateways
    take (IMROUTE_HTTP_MAX_URL_BYTES): a client could never connect with it."""
    room = limits.url_room(TOKEN_TARGET)
    size = len(token.encode())
    if size > room:
        raise InvalidInput(
            "token",
            f"is {size} bytes; a gateway takes at most {room} (its URL, "
            f"{TOKEN_TARGET}<token>, is limited to {limits.max_url_bytes} bytes by "
            "IMROUTE_HTTP_MAX_URL_BYTES)",
        )


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
        head_limits: HeadLimits | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._secret = secret
        self._clock = clock
        # The gateways' rules (IMROUTE_JWT_*): dispatch accepts the tokens they accept.
        self._token_rules = token_rules or TokenRules()
        # The gateways' limits on a request head: dispatch refuses a token they would.
        self._head_limits = head_limits or HeadLimits()
        # The fleet is read again after IMROUTE_GATEWAY_CACHE_S: try after that.
        self._retry_after_s = max(1, math.ceil(gateway_cache_s))

    async def choose(
        self, token: str | None, zone: str | None, avoid: Sequence[str] = ()
    ) -> GatewayState:
        """The gateway for the token's user, not one of `avoid` (`?avoid=` values: the
        gateways it could not connect to) unless no other fits; AuthError, InvalidInput
        for a bad `avoid` or a token too long for a gateway's URL, or Unavailable when
        none fits."""
        if self._secret is None:
            raise Unavailable("dispatch needs IMROUTE_SECRET to check tokens")
        if token is not None:
            check_token_fits(token, self._head_limits)
        uid = verify_token(self._secret, token, self._clock, self._token_rules)
        avoided = parse_avoid(avoid)
        try:
            return await self._dispatcher.choose(uid, zone, avoided)
        except NoEligibleGateway as exc:
            raise Unavailable(exc.reason, retry_after_s=self._retry_after_s) from None
