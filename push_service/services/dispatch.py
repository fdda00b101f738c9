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
from shared.positions import MAX_POS_CHARS

__all__ = [
    "MAX_AVOID",
    "TOKEN_HEADER",
    "TOKEN_TARGET",
    "Dispatch",
    "check_token_fits",
    "parse_avoid",
    "token_room",
]

# Gateway ids one request may name in `avoid` (a client names the one it failed on).
MAX_AVOID = 8
# The longest request target a client builds at a gateway: its token in the query, and
# the position it resumes from (the gateway serves /ws only, whatever path a proxy in
# front of it shows; a position is URL-safe, so it is sent as it is).
TOKEN_TARGET = "/ws?token="
RESUME_QUERY = "&since="
# The header form both SDKs send instead; the gateway's WebSocket library takes at most
# 8192 bytes a line, its CRLF included.
TOKEN_HEADER = "Sec-WebSocket-Protocol: imroute.v1, imroute.jwt."
MAX_HEADER_LINE = 8192


def token_room(limits: HeadLimits) -> int:
    """The longest token a client can connect and resume with, in either form: the URL
    `/ws?token=<token>&since=<position>` within IMROUTE_HTTP_MAX_URL_BYTES, and the
    header line `Sec-WebSocket-Protocol: imroute.v1, imroute.jwt.<token>` within the
    library's line."""
    in_url = limits.url_room(TOKEN_TARGET) - len(RESUME_QUERY) - MAX_POS_CHARS
    in_header = min(MAX_HEADER_LINE, limits.max_bytes) - len(TOKEN_HEADER) - len("\r\n")
    return min(in_url, in_header)


def check_token_fits(token: str, limits: HeadLimits) -> None:
    """InvalidInput when `token` would make the gateway's URL (with a position to resume
    from) or its header line longer than the gateways take: a client could not connect."""
    room = token_room(limits)
    size = len(token.encode())
    if size > room:
        raise InvalidInput(
            "token",
            f"is {size} bytes; a gateway takes at most {room} (its longest URL, "
            f"{TOKEN_TARGET}<token>{RESUME_QUERY}<position of up to {MAX_POS_CHARS}>, is "
            f"limited to {limits.max_url_bytes} bytes by IMROUTE_HTTP_MAX_URL_BYTES, and "
            f"the header form's line to {MAX_HEADER_LINE})",
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
