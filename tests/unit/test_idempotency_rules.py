"""The Idempotency-Key's rules, without I/O: the header, the fingerprint, what is kept."""

from __future__ import annotations

import pytest

from push_service.idempotency.base import fingerprint, is_kept, key_hash, parse_key, scope_hash
from shared.errors import InvalidInput


@pytest.mark.parametrize("value", ["a", " x ~", "k" * 255, "550e8400-e29b-41d4-a716-446655440000"])
def test_printable_keys_of_1_to_255_characters_are_taken(value: str) -> None:
    assert parse_key(value) == value


@pytest.mark.parametrize(
    ("value", "problem"),
    [("", "empty"), ("k" * 256, "at most 255"), ("a\x7f", "printable"), ("\u00e9", "printable")],
)
def test_other_values_are_refused_naming_the_header(value: str, problem: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_key(value)
    assert caught.value.field == "Idempotency-Key" and problem in caught.value.message


def test_the_fingerprint_binds_method_path_and_raw_bytes() -> None:
    base = fingerprint("POST", "/v1/push", b'{"a":1}')
    assert base == fingerprint("post", "/v1/push", b'{"a":1}')
    assert base != fingerprint("POST", "/v1/multicast", b'{"a":1}')
    assert base != fingerprint("POST", "/v1/push", b'{"a": 1}')
    # The separators keep the parts apart: no path and body that shift into each other.
    assert fingerprint("POST", "/v1/push", b"x") != fingerprint("POST", "/v1/pushx", b"")


def test_scopes_and_keys_are_digests() -> None:
    assert scope_hash("k1") != scope_hash("k2") and "k1" not in scope_hash("k1")
    assert len(key_hash("any key")) == 64


@pytest.mark.parametrize(("status", "kept"), [(200, True), (202, True), (404, True), (422, True)])
def test_answers_below_500_are_kept(status: int, kept: bool) -> None:
    assert is_kept(status) is kept


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_answers_are_not_kept(status: int) -> None:
    assert not is_kept(status)
