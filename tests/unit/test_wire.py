from __future__ import annotations

import json

import pytest
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from shared.errors import InvalidInput
from shared.models import Message
from shared.wire import PONG_FRAME, encode_push_json, parse_client_frame, ws_text_frame


def _parse_frame(data: bytes) -> Frame:
    """Parse with the websockets library's own reader, as a client would."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    gen = Frame.parse(reader.read_exact, mask=False)
    try:
        next(gen)
    except StopIteration as done:
        frame: Frame = done.value
        return frame
    raise AssertionError("incomplete frame")


def test_push_json_has_the_documented_fields_and_verbatim_content() -> None:
    message = Message("m1", "p1", 7, 'ad"min', b'{"text":"h\xc3\xa9"}', 1700000000123)
    decoded = json.loads(encode_push_json(message))
    assert decoded == {
        "type": "push",
        "msg_id": "m1",
        "push_id": "p1",
        "msg_type": 7,
        "from": 'ad"min',
        "content": {"text": "hé"},
        "ts": 1700000000123,
    }


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 200_000])
def test_text_frames_of_every_length_class_parse(size: int) -> None:
    payload = b"x" * size
    frame = _parse_frame(ws_text_frame(payload))
    assert frame.opcode is Opcode.TEXT
    assert frame.fin
    assert frame.data == payload


def test_pong_frame() -> None:
    assert json.loads(_parse_frame(PONG_FRAME).data) == {"type": "pong"}


def test_client_frames() -> None:
    assert parse_client_frame('{"type":"ping"}') is None
    assert parse_client_frame('{"type":"ack","pos":"1~3~0~0~~0"}') == "1~3~0~0~~0"
    # A malformed ack is an ack all the same (ignored and counted, never a close).
    for bad in ['{"type":"ack"}', '{"type":"ack","pos":3}', '{"type":"ack","pos":""}']:
        assert parse_client_frame(bad) == ""
    assert parse_client_frame('{"type":"ack","pos":"%s"}' % ("1" * 257)) == ""
    for junk in ["nope", "[]", '{"type":"push"}', "{}", '"ping"']:
        with pytest.raises(InvalidInput):
            parse_client_frame(junk)
