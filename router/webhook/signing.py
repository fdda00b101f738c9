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
import re

__all__ = ["HEADER", "MAX_HEADER_CHARS", "TOLERANCE_S", "SignatureError", "sign", "verify"]

HEADER = "X-Imroute-Signature"
TOLERANCE_S = 300
# A header is at most this long (a t and a dozen v1 entries fit): longer is refused
# before it is split.
MAX_HEADER_CHARS = 1024

# ASCII only, spelled out: `\d` and str.isdigit() take other scripts' digits too.
_T = re.compile(r"0|[1-9][0-9]{0,11}")
_V1 = re.compile(r"[0-9a-f]{64}")
_KEY = re.compile(r"[a-z][a-z0-9]{0,15}")
_VALUE = re.compile(r"[!-+\--~]+")  # visible ASCII but the comma


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
    """Check a received request; returns its `t`, or raises SignatureError saying why
    (and nothing else, whatever the header holds)."""
    t, candidates = _parse_header(header)
    if abs(now_s - t) > tolerance_s:
        raise SignatureError(f"t={t} is more than {tolerance_s:g} s from now")
    expected = _digest(secret, t, body)
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise SignatureError("signature does not match the body")
    return t


def _parse_header(header: str | None) -> tuple[int, list[str]]:
    """The header's `t` and its `v1` digests; SignatureError for any other shape.

    Strict on purpose: comma-separated ``key=value`` parts (spaces or tabs around a
    part allowed), ``t`` exactly once as 1 to 12 ASCII digits without a leading zero
    (``int()`` would take "²" or "٣" and refuse 5,000 digits with a bare ValueError),
    ``v1`` at least once as 64 lowercase hex digits; other keys are ignored (a later
    scheme); the whole at most MAX_HEADER_CHARS.
    """
    if not header:
        raise SignatureError(f"no {HEADER} header")
    if len(header) > MAX_HEADER_CHARS:
        raise SignatureError(f"{HEADER} is longer than {MAX_HEADER_CHARS} characters")
    t: int | None = None
    candidates: list[str] = []
    for n, part in enumerate(header.split(","), 1):
        name, eq, value = part.strip(" \t").partition("=")
        if not eq or not _KEY.fullmatch(name) or not _VALUE.fullmatch(value):
            raise SignatureError(f"{HEADER}'s part {n} is not key=value")
        if name == "t":
            if t is not None:
                raise SignatureError(f"{HEADER} has t twice")
            if not _T.fullmatch(value):
                raise SignatureError("t must be unix seconds: 1 to 12 ASCII digits")
            t = int(value)
        elif name == "v1":
            if not _V1.fullmatch(value):
                raise SignatureError("v1 must be 64 lowercase hex digits")
            candidates.append(value)
    if t is None or not candidates:
        raise SignatureError(f"{HEADER} needs t=<seconds> and v1=<hex digest>")
    return t, candidates
