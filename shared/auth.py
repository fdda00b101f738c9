"""Client tokens (HS256 JWT with `sub` = uid and a required `exp`) and API-key checks."""

from __future__ import annotations

import hmac

import jwt

from shared.clock import Clock
from shared.errors import AuthError

__all__ = ["api_key_matches", "issue_token", "valid_uid", "verify_token"]

_ALGORITHM = "HS256"


def issue_token(secret: str, uid: str, ttl_s: int, clock: Clock) -> str:
    """A client token for `uid`, valid for `ttl_s` seconds."""
    if not valid_uid(uid):
        raise AuthError("uid must be 1-128 characters of valid Unicode")
    if ttl_s <= 0:
        raise AuthError("ttl must be positive")
    now = clock.now_ms() // 1000
    return jwt.encode({"sub": uid, "iat": now, "exp": now + ttl_s}, secret, algorithm=_ALGORITHM)


def verify_token(secret: str, token: str | None, clock: Clock) -> str:
    """Return the uid of a valid token; raise AuthError saying why it is not."""
    if not token:
        raise AuthError("missing token")
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[_ALGORITHM],
            options={"require": ["exp", "sub"], "verify_exp": False},
        )
    except jwt.PyJWTError as exc:
        raise AuthError(f"invalid token: {exc}") from None
    # exp is checked against the injected clock, not PyJWT's own time.time().
    exp = claims["exp"]
    if not isinstance(exp, int | float) or exp * 1000 <= clock.now_ms():
        raise AuthError("token expired")
    uid = claims["sub"]
    if not isinstance(uid, str) or not valid_uid(uid):
        raise AuthError("invalid token: sub must be a uid of 1-128 characters")
    return uid


def valid_uid(uid: str) -> bool:
    """1-128 characters that are valid Unicode (no lone surrogates, which JSON allows)."""
    if not uid or len(uid) > 128:
        return False
    try:
        uid.encode()
    except UnicodeEncodeError:
        return False
    return True


def api_key_matches(expected: str, presented: str) -> bool:
    """Constant-time comparison of API keys."""
    return hmac.compare_digest(expected.encode(), presented.encode())
