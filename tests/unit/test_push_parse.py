"""fast_push.quick_push: never accepts what PushIn refuses, never differs from it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from push_service.fast_push import quick_push
from push_service.schemas import PushIn


def _pydantic(data: Any) -> PushIn | None:
    try:
        return PushIn.model_validate(data)
    except ValidationError:
        return None


CANONICAL: list[dict[str, Any]] = [
    {"to": ["u1"], "content": {"text": "hi"}},
    {"to": ["u1", "u2"], "content": "x", "msg_type": 7, "from": "bot", "priority": "high"},
    {"to": ["ü"], "content": None, "ttl_s": 60, "store": False, "wait_ack_ms": 0},
    {"to": [str(i) for i in range(1000)], "content": [1, 2.5, True], "wait_ack_ms": 10_000},
]


@pytest.mark.parametrize("body", CANONICAL)
def test_a_canonical_body_is_taken_with_pydantics_values(body: dict[str, Any]) -> None:
    quick = quick_push(body)
    assert quick is not None
    assert quick.model_dump() == PushIn.model_validate(body).model_dump()


# Each is valid for PushIn (lax coercions, the field's own name) or invalid: either way
# the hand check leaves it to PushIn.
LEFT_TO_PYDANTIC: list[Any] = [
    {"to": ["u1"], "content": 1, "msg_type": "5"},
    {"to": ["u1"], "content": 1, "msg_type": 5.0},
    {"to": ["u1"], "content": 1, "msg_type": True},
    {"to": ["u1"], "content": 1, "sender": "bot"},
    {"to": ["u1"], "content": 1, "ttl_s": 0},
    {"to": ["u1"], "content": 1, "ttl_s": 30 * 24 * 3600 + 1},
    {"to": ["u1"], "content": 1, "store": 1},
    {"to": ["u1"], "content": 1, "store": "true"},
    {"to": ["u1"], "content": 1, "wait_ack_ms": 10_001},
    {"to": ["u1"], "content": 1, "priority": "low"},
    {"to": ["u1"], "content": 1, "priority": ["normal"]},
    {"to": ["u1"], "content": 1, "extra": 1},
    {"to": ["u1", "u1"], "content": 1},
    {"to": [], "content": 1},
    {"to": [str(i) for i in range(1001)], "content": 1},
    {"to": ["x" * 129], "content": 1},
    {"to": [""], "content": 1},
    {"to": [1], "content": 1},
    {"to": "u1", "content": 1},
    {"to": ["u1"]},
    {"content": 1},
    {"to": ["u1"], "content": 1, "from": ""},
    {"to": ["u1"], "content": 1, "from": "x" * 129},
    {"to": ["u1"], "content": 1, "from": "0\ud83d"},
    ["not", "an", "object"],
    "text",
    None,
]


@pytest.mark.parametrize("body", LEFT_TO_PYDANTIC)
def test_anything_else_is_left_to_pydantic(body: Any) -> None:
    assert quick_push(body) is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)
_field_values = {
    "to": st.lists(st.text(max_size=3) | st.integers(), max_size=4) | _json,
    "content": _json,
    "msg_type": st.integers(-3, 2**31 + 3) | _json,
    # Lone surrogates included: json.loads lets them through, pydantic refuses them.
    "from": st.text(st.characters(codec=None, categories=None), max_size=3) | _json,
    "sender": st.text(max_size=3),
    "priority": st.sampled_from(["normal", "high", "low", ""]) | _json,
    "ttl_s": st.integers(-2, 40 * 24 * 3600) | st.none() | _json,
    "store": st.booleans() | _json,
    "wait_ack_ms": st.integers(-2, 10_002) | st.none() | _json,
    "other": _json,
}
_optional = {k: v for k, v in _field_values.items() if k not in ("to", "content", "other")}
_bodies = (
    # Mostly near-valid: real uids and content, the other fields mixed.
    st.fixed_dictionaries(
        {"to": st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=4), "content": _json},
        optional=_optional,
    )
    | st.fixed_dictionaries({}, optional={k: v for k, v in _field_values.items() if k != "other"})
    | st.dictionaries(st.sampled_from(sorted(_field_values)), _json, max_size=4)
)
TAKEN: list[int] = []


@settings(max_examples=600, deadline=None)
@given(_bodies)
def test_taken_only_where_pydantic_agrees(body: dict[str, Any]) -> None:
    """What the hand check takes, PushIn takes with the same values; JSON-decoded, as
    the hot path sees a body."""
    body = json.loads(json.dumps(body))
    quick = quick_push(body)
    if quick is None:
        return
    TAKEN.append(1)
    model = _pydantic(body)
    assert model is not None, body
    assert quick.model_dump() == model.model_dump()


def test_the_property_above_saw_bodies_taken() -> None:
    """It ran with bodies the hand check took, not only ones it left alone."""
    if not TAKEN:  # it ran in another test process (pytest-xdist): run it in this one
        test_taken_only_where_pydantic_agrees()
    assert len(TAKEN) >= 20
