"""The one uid rule (shared.uids)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import InvalidInput, InvalidUid
from shared.uids import MAX_UID_LEN, REFUSED, check_uid, uid_problem, valid_uid

GOOD = [
    "alice",
    "bob{corp}",
    "a b",  # spaces
    "ü中",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # an emoji family: zero-width joiners
    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian with a ZWNJ
    "\u00ad",  # a soft hyphen (Cf), harmless
    "x" * MAX_UID_LEN,
    "\U0010fffd",  # private use
]


@pytest.mark.parametrize("uid", GOOD)
def test_these_are_uids(uid: str) -> None:
    assert uid_problem(uid) is None and valid_uid(uid) and check_uid(uid) == uid


@pytest.mark.parametrize(
    ("uid", "problem"),
    [
        ("", "must be 1-128 characters, got 0"),
        ("x" * 129, "must be 1-128 characters, got 129"),
        ("a\x00", "must not hold control characters: U+0000 at character 2"),
        ("a\nb", "must not hold control characters: U+000A at character 2"),
        ("\x1b[2J", "must not hold control characters: U+001B at character 1"),
        ("a\x7f", "must not hold control characters: U+007F at character 2"),
        ("a\x85", "must not hold control characters: U+0085 at character 2"),
        ("a\u2028", "must not hold control characters: U+2028 at character 2"),
        ("a\u2029", "must not hold control characters: U+2029 at character 2"),
        ("x\u202egpj.exe", "must not hold control characters: U+202E at character 2"),
        ("x\u2066", "must not hold control characters: U+2066 at character 2"),
        ("x\u200f", "must not hold control characters: U+200F at character 2"),
        ("x\u061c", "must not hold control characters: U+061C at character 2"),
        ("x\ud83d", "must be valid Unicode (no lone surrogates)"),
        (5, "must be a string"),
        (None, "must be a string"),
    ],
)
def test_these_are_not(uid: object, problem: str) -> None:
    assert uid_problem(uid) == problem and not valid_uid(uid)
    before = REFUSED.total
    with pytest.raises(InvalidUid) as info:
        check_uid(uid, "body.to.0")
    assert isinstance(info.value, InvalidInput)
    assert (info.value.field, info.value.message) == ("body.to.0", problem)
    assert REFUSED.total == before + 1


@given(st.text(st.characters(codec=None, categories=None), max_size=140))
def test_the_rule_is_every_control_surrogate_separator_and_bidi_character(uid: str) -> None:
    bidi = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
    refused = any(
        unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") or ord(c) in bidi for c in uid
    )
    expected = 1 <= len(uid) <= MAX_UID_LEN and not refused
    assert valid_uid(uid) is expected
    assert (uid_problem(uid) is None) is expected


def test_a_refusal_never_quotes_the_uid() -> None:
    with pytest.raises(InvalidUid) as info:
        check_uid("secret\x1b[31m")
    assert "secret" not in str(info.value) and "\x1b" not in str(info.value)


def test_a_good_uid_is_passed_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The push path checks every uid of a push (PushIn's validator): a uid that keeps
    the rule costs the fast test alone, never the diagnosis of what is wrong."""
    import push_service.schemas
    import shared.uids

    def diagnosed(uid: object) -> str | None:
        raise AssertionError("uid_problem called for a good uid")

    monkeypatch.setattr(shared.uids, "uid_problem", diagnosed)
    assert check_uid("alice") == "alice"
    assert push_service.schemas.check_uid_value("bob{corp}") == "bob{corp}"
    monkeypatch.setattr(push_service.schemas, "check_uid", diagnosed)
    assert push_service.schemas.check_uid_value("carol") == "carol"
