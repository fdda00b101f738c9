"""The endpoint's sans-I/O decisions (socket_gateway/ws/protocol.py)."""

from __future__ import annotations

from socket_gateway.ws.protocol import (
    CLOSE_INVALID_DATA,
    CLOSE_POLICY,
    PING_FRAME,
    client_text,
    close_reason,
)


def test_a_ping_is_answered_and_anything_else_closes() -> None:
    assert client_text(b'{"type":"ping"}') is None
    assert client_text(bytearray(b'{"type":"ping"}')) is None
    assert client_text(b'{"type":"\xff"}') == (CLOSE_INVALID_DATA, "text frames must be UTF-8")
    for junk in (b"not json", b'{"type":"push"}', b"[1,2]"):
        refused = client_text(junk)
        assert refused is not None and refused[0] == CLOSE_POLICY
        assert "ping" in refused[1] or "JSON" in refused[1]


def test_close_reasons_fit_a_close_frame() -> None:
    assert close_reason("short") == "short"
    long = close_reason("é" * 200)
    assert len(long.encode()) <= 123 and long == "é" * 60
    # A multi-byte character cut in half is dropped, not mangled.
    assert close_reason("a" + "é" * 100) == "a" + "é" * 59


def test_the_ping_frame_is_an_empty_unmasked_ping() -> None:
    assert bytes([0x80 | 0x9, 0]) == PING_FRAME
