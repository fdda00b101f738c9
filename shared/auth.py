"""Client tokens (HS256 JWT with `sub` = uid and a required `exp`) and API-key checks."""

from __future__ import annotations

import hmac
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jwt

from shared.clock import Clock
from shared.errors import AuthError, InvalidUid
from shared.uids import check_uid

if TYPE_CHECKING:
    from shared.settings import ClientTokenSettings

__all__ = ["TokenRules", "api_key_matches", "issue_token", "verify_token"]

_ALGORITHM = "HS256"


@dataclass(frozen=True, slots=True)
class TokenRules:
    """What a client token must satisfy beyond its signature (IMROUTE_JWT_*).

    `audience` and `issuer` are enforced when set (a token that carries an `aud` is
    refused when no audience is set, RFC 7519 4.1.3); `leeway_s` absorbs clock skew on
    `exp`, `nbf` and `iat`; `max_ttl_s` (None: no maximum) refuses tokens that live
    longer: `exp - iat`, or `exp - now` for a token without `iat`.
    """

    audience: str | None = None
    issuer: str | None = None
    leeway_s: float = 30.0
    max_ttl_s: float | None = 86_400.0

    @classmethod
    def from_settings(cls, settings: ClientTokenSettings) -> TokenRules:
        return cls(
            audience=settings.jwt_audience,
            issuer=settings.jwt_issuer,
            leeway_s=settings.jwt_leeway_s,
            max_ttl_s=settings.jwt_max_ttl_s or None,
        )


DEFAULT_RULES = TokenRules()


def issue_token(
    secret: str,
    uid: str,
    ttl_s: int,
    clock: Clock,
    *,
    audience: str | None = None,
    issuer: str | None = None,
) -> str:
    """A client token for `uid`, valid for `ttl_s` seconds; InvalidUid for a uid that
    breaks the uid rule (`shared.uids`)."""
    check_uid(uid)
    if ttl_s <= 0:
        raise AuthError("ttl must be positive")
    now = clock.now_ms() // 1000
    claims: dict[str, Any] = {"sub": uid, "iat": now, "exp": now + ttl_s}
    if audience is not None:
        claims["aud"] = audience
    if issuer is not None:
        claims["iss"] = issuer
    return jwt.encode(claims, secret, algorithm=_ALGORITHM)


def verify_token(
    secret: str, token: str | None, clock: Clock, rules: TokenRules = DEFAULT_RULES
) -> str:
    """Return the uid of a valid token; raise AuthError saying why it is not."""
    if not token:
        raise AuthError("missing token")
    claims = _signed_claims(secret, token, rules)
    now = clock.now_ms() / 1000
    leeway = rules.leeway_s
    exp = _number(claims, "exp")
    assert exp is not None  # required above
    if exp + leeway <= now:
        raise AuthError("token expired")
    nbf = _number(claims, "nbf")
    if nbf is not None and nbf > now + leeway:
        raise AuthError("token not valid yet (nbf)")
    iat = _number(claims, "iat")
    if iat is not None and iat > now + leeway:
        raise AuthError("token issued in the future (iat)")
    if rules.max_ttl_s is not None:
        # Without iat the lifetime left is what counts; the leeway covers the issuer's
        # clock being ahead of ours.
        lifetime = exp - iat if iat is not None else exp - now - leeway
        if lifetime > rules.max_ttl_s:
            raise AuthError(
                f"token lifetime {math.ceil(lifetime)}s is over the maximum "
                f"{rules.max_ttl_s:g}s (IMROUTE_JWT_MAX_TTL_S)"
            )
    try:
        return check_uid(claims["sub"], "sub")
    except InvalidUid as exc:
        raise AuthError(f"invalid token: {exc}") from None


def _signed_claims(secret: str, token: str, rules: TokenRules) -> dict[str, Any]:
    """The claims of a token signed with `secret` that carries what `rules` ask (its
    times are checked by the caller); AuthError naming what is wrong with it."""
    try:
        return jwt.decode(
            token,
            secret,
            algorithms=[_ALGORITHM],
            audience=rules.audience,
            issuer=rules.issuer,
            # The times are checked by the caller against the injected clock, not PyJWT's own
            # time.time().
            options={
                "require": ["exp", "sub"],
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
            },
        )
    except jwt.MissingRequiredClaimError as exc:
        raise AuthError(f"invalid token: it has no {exc.claim} claim") from None
    except jwt.InvalidAudienceError:
        raise AuthError("invalid token: wrong audience (aud)") from None
    except jwt.InvalidIssuerError:
        raise AuthError("invalid token: wrong issuer (iss)") from None
    except jwt.InvalidSignatureError:
        raise AuthError(
            "invalid token: its signature does not match (signed with another secret than "
            "this deployment's IMROUTE_SECRET)"
        ) from None
    except jwt.DecodeError as exc:
        raise AuthError(
            f"invalid token: not a JWT ({exc}); a client token is a JWT signed with "
            "IMROUTE_SECRET (`imroute token UID` makes one), not an API key"
        ) from None
    except jwt.PyJWTError as exc:
        raise AuthError(f"invalid token: {exc}") from None


def _number(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    # bool is an int to Python, never a time to anyone else.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise AuthError(f"invalid token: {name} must be a number of seconds")
    return float(value)


def api_key_matches(expected: str, presented: str) -> bool:
    """Constant-time comparison of API keys."""
    return hmac.compare_digest(expected.encode(), presented.encode())
