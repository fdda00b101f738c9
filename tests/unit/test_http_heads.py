"""The request head's limits, sans I/O (shared.http_heads): whole heads checked, heads
gathered read by read without keeping more than the limit, the settings behind them."""

from __future__ import annotations

import time

import pytest

from push_service.services.dispatch import TOKEN_HEADER, TOKEN_TARGET, check_token_fits, token_room
from shared.errors import ConfigError, InvalidInput
from shared.http_heads import HeadLimits, HeadRefusal, check_head, gather_head
from shared.positions import MAX_POS_CHARS
from shared.settings import Settings

LIMITS = HeadLimits(max_bytes=1024, max_headers=10, max_url_bytes=300)


def head(target: str = "/", fields: int = 1, pad: int = 0) -> bytes:
    lines = [f"GET {target} HTTP/1.1", *(f"X-{n}: v" for n in range(fields - 1))]
    if pad:
        lines.append("X-Pad: " + "a" * pad)
    else:
        lines.append("Host: x")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_whole_head_is_checked_against_each_limit() -> None:
    assert check_head(head(), LIMITS) is None
    assert check_head(head(fields=10), LIMITS) is None
    refusal = check_head(head(fields=11), LIMITS)
    assert refusal is not None and (refusal.status, refusal.error) == (431, "too_many_headers")
    assert "IMROUTE_HTTP_MAX_HEADERS" in refusal.detail
    assert check_head(head("/" + "a" * 299), LIMITS) is None
    refusal = check_head(head("/" + "a" * 300), LIMITS)
    assert refusal is not None and (refusal.status, refusal.error) == (414, "uri_too_long")
    assert "300 bytes (IMROUTE_HTTP_MAX_URL_BYTES)" in refusal.detail
    exact = head(pad=1024 - len(head(pad=1)) + 1)
    assert len(exact) == 1024 and check_head(exact, LIMITS) is None
    refusal = check_head(head(pad=len(exact) - len(head(pad=1)) + 2), LIMITS)
    assert refusal is not None and (refusal.status, refusal.error) == (431, "headers_too_large")
    assert "IMROUTE_HTTP_MAX_HEAD_BYTES" in refusal.detail


@pytest.mark.parametrize("piece", [1, 7, 100, 5000])
def test_a_head_gathered_in_pieces_gives_the_head_and_what_follows(piece: int) -> None:
    data = head(fields=5) + b"BODY" + head()
    buffer = bytearray()
    got = None
    for start in range(0, len(data), piece):
        got = gather_head(buffer, data[start : start + piece], LIMITS)
        if got is not None:
            break
    assert got == (head(fields=5), data[len(head(fields=5)) : start + piece])


def test_a_head_at_the_limit_is_taken_and_one_byte_more_is_refused_unkept() -> None:
    exact = head(pad=1024 - len(head(pad=1)) + 1)
    assert gather_head(bytearray(), exact + b"rest", LIMITS) == (exact, b"rest")
    over = head(pad=1024 - len(head(pad=1)) + 2)
    buffer = bytearray()
    assert gather_head(buffer, over[:1000], LIMITS) is None
    refusal = gather_head(buffer, over[1000:], LIMITS)
    assert isinstance(refusal, HeadRefusal) and refusal.status == 431
    assert len(buffer) == 1024  # never more than the limit kept


def test_a_huge_value_a_byte_at_a_time_costs_linear_time() -> None:
    """The end of the head is looked for from where the last look stopped: no rescan of
    what was gathered, no copy of it."""
    limits = HeadLimits(max_bytes=1 << 20, max_headers=10, max_url_bytes=300)

    def gather(size: int) -> float:
        buffer = bytearray(b"GET / HTTP/1.1\r\nX: ")
        began = time.perf_counter()
        for _ in range(size):
            assert gather_head(buffer, b"a", limits) is None
        return time.perf_counter() - began

    small, large = gather(50_000), gather(400_000)
    assert large < small * 8 * 3, (small, large)  # 8 times the bytes: linear, with slack


def test_the_limits_must_fit_together() -> None:
    # What each reads: tests/unit/test_settings_limits.py.
    with pytest.raises(ConfigError, match=r"IMROUTE_HTTP_MAX_URL_BYTES .* must be less than"):
        Settings.load({"IMROUTE_HTTP_MAX_HEAD_BYTES": "4096"})
    with pytest.raises(ConfigError, match="IMROUTE_HTTP_MAX_HEADERS"):
        Settings.load({"IMROUTE_HTTP_MAX_HEADERS": "129"})  # the gateway's library's cap


def test_dispatch_refuses_a_token_longer_than_a_gateway_url_takes() -> None:
    limits = HeadLimits(max_url_bytes=300)
    room = 300 - len(TOKEN_TARGET) - len("&since=") - MAX_POS_CHARS  # with a resume's pos
    check_token_fits("t" * room, limits)
    with pytest.raises(InvalidInput) as refused:
        check_token_fits("t" * (room + 1), limits)
    assert refused.value.field == "token"
    assert f"is {room + 1} bytes; a gateway takes at most {room}" in refused.value.message
    assert "IMROUTE_HTTP_MAX_URL_BYTES" in refused.value.message


def test_the_token_room_is_the_smaller_of_the_url_and_the_header_line() -> None:
    # Defaults: the URL, with a resume's position, is the tighter.
    assert token_room(HeadLimits()) == 8000 - len("/ws?token=&since=") - 256 == 7727
    # A target as long as a line: the header line is ("...jwt.<token>\r\n" <= 8192).
    header = len("Sec-WebSocket-Protocol: imroute.v1, imroute.jwt.")
    assert header == len(TOKEN_HEADER)
    assert token_room(HeadLimits(max_bytes=20000, max_url_bytes=9000)) == 8192 - header - 2
