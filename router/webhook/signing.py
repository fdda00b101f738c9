"""Signing webhook requests as Stripe signs its webhooks (pure: no I/O, time passed in).

``X-Imroute-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>``.
A receiver recomputes the digest over the raw body it received, compares it in constant
time, and refuses a ``t`` older (or newer) than its tolerance, so a captured request
cannot be replayed later. Several ``v1=`` entries may appear (a secret being rotated):
any one matching is enough.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["HEADER", "TOLERANCE_S", "SignatureError", "sign", "verify"]

HEADER = "X-Imroute-Signature"
TOLERANCE_S = 300


class SignatureError(ValueError):
    """A request's signature header is missing, malformed, stale or does not match."""


def _digest(secret: str, t: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, t: int) -> str:
    """The header's value for `body` sent at unix second `t`."""
    return f"t={t},v1={_digest(secret, t, body)}"


def verify(
    secret: str, body: bytes, header: str | None, now_s: float, tolerance_s: float = TOLERANCE_S
) -> int:
    """Check a received request; returns its `t`, or raises SignatureError saying why."""
    if not header:
        raise SignatureError(f"no {HEADER} header")
    t: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            t = int(value)
        elif name == "v1" and value:
            candidates.append(value)
    if t is None or not candidates:
        raise SignatureError(f"{HEADER} needs t=<seconds> and v1=<hex digest>")
    if abs(now_s - t) > tolerance_s:
        raise SignatureError(f"t={t} is more than {tolerance_s:g} s from now")
    expected = _digest(secret, t, body)
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise SignatureError("signature does not match the body")
    return t
