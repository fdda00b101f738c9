"""Reading the gateway's frames."""

from __future__ import annotations

import json
from typing import Any

import pytest
from imroute_client.errors import ProtocolError
from imroute_client.frames import Message, Reconnect, Recovered, Unknown, parse_frame

PUSH: dict[str, Any] = {
    "type": "push", "msg_id": "m1", "push_id": "p1", "msg_type": 0, "from": "admin",
    "content": {"text": "hi"}, "ts": 1796021395420,
}  # fmt: skip


def test_todays_push_frame_has_no_position() -> None:
    msg = parse_frame(json.dumps(PUSH))
    assert msg == Message("m1", "p1", 0, "admin", {"text": "hi"}, 1796021395420, None, False)


def test_a_replayed_push_keeps_its_position_and_says_it_was_recovered() -> None:
    msg = parse_frame(json.dumps({**PUSH, "pos": "AbC-1_2", "recovered": True}).encode())
    assert isinstance(msg, Message)
    assert msg.pos == "AbC-1_2" and msg.recovered


def test_reconnect_recovered_and_unknown_frames() -> None:
    assert parse_frame('{"type":"reconnect","reason":"drain"}') == Reconnect("drain")
    assert parse_frame('{"type":"recovered","count":3,"complete":false}') == Recovered(3, False)
    assert parse_frame('{"type":"pong"}') == Unknown("pong")
    assert parse_frame('{"type":7}') == Unknown(None)


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        "[1]",
        json.dumps({**PUSH, "msg_id": None}),
        json.dumps({**PUSH, "ts": "yesterday"}),
        json.dumps({**PUSH, "msg_type": True}),
        json.dumps({**PUSH, "pos": 5}),
        json.dumps({**PUSH, "pos": "x" * 257}),
        '{"type":"recovered","count":"3","complete":true}',
        '{"type":"recovered","count":3}',
    ],
)
def test_frames_that_break_the_protocol_are_refused(frame: str) -> None:
    with pytest.raises(ProtocolError):
        parse_frame(frame)
