"""What a client token must carry beyond its signature (shared/auth.py `TokenRules`)."""

from __future__ import annotations

from typing import Any

import jwt
import pytest

from router.testing import ManualClock
from shared.auth import TokenRules, issue_token, verify_token
from shared.errors import AuthError

SECRET = "s" * 32


def signed(clock: ManualClock, **claims: Any) -> str:
    now = clock.now_ms() // 1000
    base: dict[str, Any] = {"sub": "alice", "iat": now, "exp": now + 60}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, SECRET, "HS256")


def test_audience_and_issuer_are_enforced_when_set() -> None:
    clock = ManualClock()
    rules = TokenRules(audience="app", issuer="auth.example")
    good = signed(clock, aud="app", iss="auth.example")
    assert verify_token(SECRET, good, clock, rules) == "alice"
    assert verify_token(SECRET, signed(clock, aud=["web", "app"], iss="auth.example"), clock,
                        rules) == "alice"  # fmt: skip
    for token, why in [
        (signed(clock, iss="auth.example"), "no aud claim"),
        (signed(clock, aud="other", iss="auth.example"), "wrong audience"),
        (signed(clock, aud="app"), "no iss claim"),
        (signed(clock, aud="app", iss="evil.example"), "wrong issuer"),
    ]:
        with pytest.raises(AuthError, match=why):
            verify_token(SECRET, token, clock, rules)
    # Unset: no iss needed, and a token meant for an audience is not ours (RFC 7519 4.1.3).
    assert verify_token(SECRET, signed(clock, iss="anyone"), clock) == "alice"
    with pytest.raises(AuthError, match="wrong audience"):
        verify_token(SECRET, signed(clock, aud="app"), clock)


def test_the_leeway_covers_exp_nbf_and_iat() -> None:
    clock = ManualClock()
    now = clock.now_ms() // 1000
    rules = TokenRules(leeway_s=10)
    assert verify_token(SECRET, signed(clock, exp=now - 9), clock, rules) == "alice"
    with pytest.raises(AuthError, match="expired"):
        verify_token(SECRET, signed(clock, exp=now - 10), clock, rules)
    assert verify_token(SECRET, signed(clock, nbf=now + 10), clock, rules) == "alice"
    with pytest.raises(AuthError, match="not valid yet"):
        verify_token(SECRET, signed(clock, nbf=now + 11), clock, rules)
    assert verify_token(SECRET, signed(clock, iat=now + 10, exp=now + 70), clock, rules)
    with pytest.raises(AuthError, match="issued in the future"):
        verify_token(SECRET, signed(clock, iat=now + 11, exp=now + 70), clock, rules)
    strict = TokenRules(leeway_s=0)
    with pytest.raises(AuthError, match="expired"):
        verify_token(SECRET, signed(clock, exp=now), clock, strict)


def test_tokens_that_live_longer_than_the_maximum_are_refused() -> None:
    clock = ManualClock()
    now = clock.now_ms() // 1000
    rules = TokenRules(max_ttl_s=3600, leeway_s=30)
    assert verify_token(SECRET, signed(clock, exp=now + 3600), clock, rules) == "alice"
    with pytest.raises(AuthError, match="lifetime 3601s is over the maximum 3600s"):
        verify_token(SECRET, signed(clock, exp=now + 3601), clock, rules)
    # exp - iat counts, however much of it is left.
    old = signed(clock, iat=now - 7200, exp=now + 60)
    with pytest.raises(AuthError, match="IMROUTE_JWT_MAX_TTL_S"):
        verify_token(SECRET, old, clock, rules)
    # Without iat, what is left (the leeway allows for the issuer's clock being ahead).
    assert verify_token(SECRET, signed(clock, iat=None, exp=now + 3630), clock, rules)
    with pytest.raises(AuthError, match="lifetime"):
        verify_token(SECRET, signed(clock, iat=None, exp=now + 3631), clock, rules)
    # No maximum.
    forever = signed(clock, iat=None, exp=2**40)
    assert verify_token(SECRET, forever, clock, TokenRules(max_ttl_s=None)) == "alice"
    with pytest.raises(AuthError, match="lifetime"):
        verify_token(SECRET, forever, clock)  # the default: a day


@pytest.mark.parametrize("claim", ["exp", "iat", "nbf"])
@pytest.mark.parametrize("value", ["soon", True, float("inf")])
def test_times_must_be_numbers(claim: str, value: object) -> None:
    clock = ManualClock()
    with pytest.raises(AuthError, match=f"{claim} must be a number"):
        verify_token(SECRET, signed(clock, **{claim: value}), clock)


def test_exp_is_required() -> None:
    clock = ManualClock()
    with pytest.raises(AuthError, match="no exp claim"):
        verify_token(SECRET, signed(clock, exp=None), clock)


def test_issued_tokens_carry_audience_and_issuer() -> None:
    clock = ManualClock()
    rules = TokenRules(audience="app", issuer="imroute")
    token = issue_token(SECRET, "bob", 60, clock, audience="app", issuer="imroute")
    assert verify_token(SECRET, token, clock, rules) == "bob"
    with pytest.raises(AuthError):
        verify_token(SECRET, issue_token(SECRET, "bob", 60, clock), clock, rules)


def test_a_refusal_says_what_kind_of_token_was_sent() -> None:
    """What a client (or an app developer) gets back names the mistake: an API key or
    garbage where a JWT belongs, or a JWT signed with another secret."""
    clock = ManualClock()
    for token, why in [
        ("an-api-key-0123456789", r"not a JWT \(Not enough segments\).*imroute token UID"),
        ("a.b.c", r"not a JWT"),
        (jwt.encode({"sub": "alice", "exp": 9e9}, "t" * 32, "HS256"), "signature does not match"),
    ]:
        with pytest.raises(AuthError, match=why):
            verify_token(SECRET, token, clock)
