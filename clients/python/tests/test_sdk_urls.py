"""The URLs the client asks."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from imroute_client.urls import dispatch_url, resume_url, token_subprotocols, ws_connect_url


def test_dispatch_url_with_or_without_a_trailing_slash() -> None:
    assert dispatch_url("http://h:8080") == "http://h:8080/v1/dispatch"
    assert dispatch_url("http://h:8080/api/") == "http://h:8080/api/v1/dispatch"


def test_token_alone_when_there_is_no_position() -> None:
    assert ws_connect_url("ws://h:1/ws", "a.b.c") == "ws://h:1/ws?token=a.b.c"


def test_since_is_added_and_everything_is_url_encoded() -> None:
    url = ws_connect_url("wss://h/ws?zone=eu&token=old", "t+/=", "1-2 &x")
    parts = urlsplit(url)
    assert parts.scheme == "wss" and parts.path == "/ws"
    assert "&x" not in parts.query and "+/" not in parts.query
    assert parse_qs(parts.query) == {"zone": ["eu"], "token": ["t+/="], "since": ["1-2 &x"]}


def test_the_resume_url_never_holds_a_token() -> None:
    assert resume_url("ws://h:1/ws") == "ws://h:1/ws"
    url = resume_url("wss://h/ws?zone=eu&token=old&since=x", "2~1.5~0.0~0.0~~0.0")
    assert parse_qs(urlsplit(url).query) == {"zone": ["eu"], "since": ["2~1.5~0.0~0.0~~0.0"]}


def test_the_token_rides_in_a_subprotocol_beside_the_selected_one() -> None:
    assert token_subprotocols("a.b.c") == ["imroute.v1", "imroute.jwt.a.b.c"]
