"""The endpoint's sans-I/O decisions (socket_gateway/ws/protocol.py)."""

from __future__ import annotations

import json
import logging

from websockets.typing import Subprotocol

from socket_gateway.ws.protocol import (
    CLOSE_INVALID_DATA,
    CLOSE_POLICY,
    PING_FRAME,
    QuietLog,
    client_text,
    close_reason,
    json_refusal,
    select_subprotocol,
    token_of,
)


def test_a_ping_is_answered_an_ack_is_read_and_anything_else_closes() -> None:
    assert client_text(b'{"type":"ping"}') is None
    assert client_text(bytearray(b'{"type":"ping"}')) is None
    assert client_text(b'{"type":"ack","pos":"1~1~0~0~~0"}') == "1~1~0~0~~0"
    assert client_text(b'{"type":"ack","pos":7}') == ""
    assert client_text(b'{"type":"\xff"}') == (CLOSE_INVALID_DATA, "text frames must be UTF-8")
    for junk in (b"not json", b'{"type":"push"}', b"[1,2]", b"[" * 2000, b"[" * 999 + b"]" * 999):
        refused = client_text(junk)
        assert isinstance(refused, tuple) and refused[0] == CLOSE_POLICY
        assert "ping" in refused[1] or "JSON" in refused[1]


def test_close_reasons_fit_a_close_frame() -> None:
    assert close_reason("short") == "short"
    long = close_reason("é" * 200)
    assert len(long.encode()) <= 123 and long == "é" * 60
    # A multi-byte character cut in half is dropped, not mangled.
    assert close_reason("a" + "é" * 100) == "a" + "é" * 59


def test_the_ping_frame_is_an_empty_unmasked_ping() -> None:
    assert bytes([0x80 | 0x9, 0]) == PING_FRAME


def test_the_token_comes_from_a_subprotocol_or_the_query() -> None:
    assert token_of({"token": ["q"]}, []) == "q"
    assert token_of({}, ["imroute.v1", "imroute.jwt.a.b.c"]) == "a.b.c"
    assert token_of({"token": ["q"]}, ["imroute.jwt.h"]) == "h"  # the header wins
    assert token_of({}, ["imroute.v1"]) is None
    assert token_of({"token": [""]}, []) == ""


def test_imroute_v1_is_selected_when_offered_and_nothing_else_is() -> None:
    v1, jwt = Subprotocol("imroute.v1"), Subprotocol("imroute.jwt.a.b.c")
    assert select_subprotocol(None, [jwt, v1]) == "imroute.v1"
    assert select_subprotocol(None, [jwt]) is None  # never the token
    assert select_subprotocol(None, []) is None


def test_refusals_are_json_with_retry_after_when_given() -> None:
    r = json_refusal(503, "gateway_full", "full", retry_after_s=2)
    assert (r.status_code, r.reason_phrase) == (503, "Service Unavailable")
    assert json.loads(r.body) == {"error": "gateway_full", "detail": "full"}
    assert r.headers["Content-Type"] == "application/json"
    assert r.headers["Content-Length"] == str(len(r.body))
    assert r.headers["Retry-After"] == "2" and r.headers["Connection"] == "close"
    assert "Retry-After" not in json_refusal(401, "unauthorized", "no").headers


def test_the_handshake_log_never_passes_debug_or_info() -> None:
    base = logging.getLogger("t.quiet")
    base.setLevel(logging.DEBUG)
    quiet = QuietLog(base)
    assert not quiet.isEnabledFor(logging.DEBUG) and not quiet.isEnabledFor(logging.INFO)
    assert quiet.isEnabledFor(logging.WARNING)
