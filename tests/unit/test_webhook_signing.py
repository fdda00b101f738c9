"""The webhook signer and verifier (pure): Stripe's scheme, t=<s>,v1=<HMAC-SHA256>."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from router.webhook.base import Event, encode_event, events_body
from router.webhook.delivery import BACKOFF_BASE_S, Outcome, outcome_of
from router.webhook.signing import SignatureError, sign, verify
from shared.backoff import backoff_s
from shared.errors import InvalidInput
from tests.integration.webhook_receiver import check_signature

SECRET = "whsec-0123456789abcdef"
BODY = b'{"events":[{"event_id":"e1","type":"user.offline","ts":1,"uid":"a","epoch":2}]}'
T = 1_800_000_000


def test_the_header_is_hmac_sha256_over_t_dot_body() -> None:
    expected = hmac.new(SECRET.encode(), f"{T}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, BODY, T) == f"t={T},v1={expected}"


def test_a_fresh_signature_verifies_here_and_in_the_readme_style_receiver() -> None:
    header = sign(SECRET, BODY, T)
    assert verify(SECRET, BODY, header, now_s=T + 10) == T
    assert check_signature(SECRET, BODY, header, now_s=T + 10) is None


def test_a_tampered_body_is_refused() -> None:
    header = sign(SECRET, BODY, T)
    tampered = BODY.replace(b'"uid":"a"', b'"uid":"b"')
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, tampered, header, now_s=T)
    assert check_signature(SECRET, tampered, header, now_s=T) == "signature mismatch"


def test_another_secret_is_refused() -> None:
    with pytest.raises(SignatureError, match="does not match"):
        verify("another-secret-0123456", BODY, sign(SECRET, BODY, T), now_s=T)


def test_a_stale_or_future_t_is_refused_even_when_the_digest_matches() -> None:
    header = sign(SECRET, BODY, T)
    for now in (T + 301, T - 301):
        with pytest.raises(SignatureError, match="from now"):
            verify(SECRET, BODY, header, now_s=now)
    assert verify(SECRET, BODY, header, now_s=T + 299) == T
    with pytest.raises(SignatureError):
        verify(SECRET, BODY, header, now_s=T + 61, tolerance_s=60)
    assert check_signature(SECRET, BODY, header, now_s=T + 301) == f"stale t={T}"


def test_a_replayed_t_with_a_new_digest_is_refused() -> None:
    # Moving t forward to dodge the tolerance breaks the digest, which covers t.
    _, digest = sign(SECRET, BODY, T).split(",")
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, BODY, f"t={T + 600},{digest}", now_s=T + 600)


@pytest.mark.parametrize("header", [None, "", "v1=abc", f"t={T}", "t=x,v1=ab", "garbage"])
def test_malformed_headers_are_refused(header: str | None) -> None:
    with pytest.raises(SignatureError):
        verify(SECRET, BODY, header, now_s=T)


def test_any_of_several_v1_entries_may_match() -> None:
    good = sign(SECRET, BODY, T).split(",")[1]
    assert verify(SECRET, BODY, f"t={T},v1={'0' * 64},{good}", now_s=T) == T


def test_events_are_one_json_object_each_with_the_envelope_fields() -> None:
    event = Event("message.unacked", "unacked:p1", 1700, {"push_id": "p1", "uids": ["a"]})
    encoded = encode_event(event)
    assert json.loads(encoded) == {
        "event_id": "unacked:p1",
        "type": "message.unacked",
        "ts": 1700,
        "push_id": "p1",
        "uids": ["a"],
    }
    assert json.loads(events_body([encoded, encoded])) == {"events": [json.loads(encoded)] * 2}
    with pytest.raises(InvalidInput, match="ts"):
        encode_event(Event("user.online", "x", 1, {"ts": 2}))


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.SENT),
        (204, Outcome.SENT),
        (None, Outcome.RETRY),
        (500, Outcome.RETRY),
        (503, Outcome.RETRY),
        (408, Outcome.RETRY),
        (429, Outcome.RETRY),
        (400, Outcome.DROP),
        (401, Outcome.DROP),
        (404, Outcome.DROP),
        (301, Outcome.DROP),
    ],
)
def test_what_an_answer_means(status: int | None, outcome: Outcome) -> None:
    assert outcome_of(status) is outcome


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    assert 0.25 <= backoff_s(1, BACKOFF_BASE_S, 30) <= 0.5
    assert 2.0 <= backoff_s(4, BACKOFF_BASE_S, 30) <= 4.0
    assert 15 <= backoff_s(50, BACKOFF_BASE_S, 30) <= 30
    assert backoff_s(10_000, BACKOFF_BASE_S, 0.2) <= 0.2


def test_a_batch_is_split_into_posts_of_at_most_a_byte_bound() -> None:
    from router.webhook.consumer import Entry
    from router.webhook.sender import split_by_bytes

    batch = [Entry(f"{n}-0", "x" * 99) for n in range(10)]  # 100 bytes each, comma too
    assert [len(p) for p in split_by_bytes(batch, 300)] == [3, 3, 3, 1]
    assert [len(p) for p in split_by_bytes(batch, 10_000)] == [10]
    # One event over the bound still goes, alone.
    assert [len(p) for p in split_by_bytes([Entry("1-0", "y" * 500), *batch[:2]], 300)] == [1, 2]
    assert split_by_bytes([], 300) == []
