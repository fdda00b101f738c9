"""The pos codec: URL-safe, bounded, and anything not ours reads as no position."""

from __future__ import annotations

import string

import pytest

from shared.positions import (
    MAX_POS_CHARS,
    Pos,
    counter_of,
    decode_pos,
    encode_pos,
    epoch_of,
    seq_of,
)

URL_SAFE = set(string.ascii_letters + string.digits + "-._~")


def test_a_position_round_trips_and_is_url_safe() -> None:
    text = encode_pos(12, 340, 5, "g-1.x_y", 77)
    assert set(text) <= URL_SAFE
    assert decode_pos(text) == Pos(12, 340, 5, "g-1.x_y", 77)
    assert decode_pos(encode_pos(0, 0, 0, "", 0)) == Pos()


def test_the_largest_position_fits_in_256_characters() -> None:
    big = 10**18 - 1
    text = encode_pos(big, big, big, "g" * 64, big)
    assert len(text) <= MAX_POS_CHARS and decode_pos(text) == Pos(big, big, big, "g" * 64, big)


@pytest.mark.parametrize(
    "junk",
    [
        None,
        "",
        "x" * 300,
        "1~1~2~3~g1~4" + "0" * 250,  # too long
        "2~1~2~3~g1~4",  # another version
        "1~01~2~3~g1~4",  # leading zero: not a text we write
        "1~-1~2~3~g1~4",
        "1~1~2~3~g 1~4",
        "1~1~2~3~g1",
        "1~1~2~3~g1~4~5",
        "1~1~2~3~" + "g" * 65 + "~4",  # not a group id
        "1~99999999999999999999~0~0~g1~0",  # beyond 64 bits
        "../../etc/passwd",
        "1~1~2~3~g1~4\n",
    ],
)
def test_junk_is_no_position(junk: str | None) -> None:
    assert decode_pos(junk) is None


def test_a_position_with_epochs_round_trips_as_version_2() -> None:
    """Seqs of a log with an epoch (every log Redis numbers now) are written as
    <n>.<epoch>; a v1 text still reads, as epoch 0."""
    e = 1_796_000_000_000  # the Redis clock in ms when the log was born
    p, b, g = seq_of(e, 12), seq_of(e + 5, 340), seq_of(e + 9, 77)
    text = encode_pos(p, b, 0, "g1", g)
    assert text == f"2~12.{e}~340.{e + 5}~0.0~g1~77.{e + 9}" and set(text) <= URL_SAFE
    assert decode_pos(text) == Pos(p, b, 0, "g1", g)
    assert (epoch_of(p), counter_of(p)) == (e, 12)
    assert decode_pos("1~12~340~5~g1~77") == Pos(12, 340, 5, "g1", 77)


@pytest.mark.parametrize(
    "junk",
    [
        "2~1.5~0.0~0.0~g1",  # a field short
        "2~1~0.0~0.0~g1~0.0",  # a counter without its epoch
        "2~01.5~0.0~0.0~g1~0.0",  # leading zero
        f"2~{2**40}.5~0.0~0.0~g1~0.0",  # beyond a log's counter
        "2~1.5.6~0.0~0.0~g1~0.0",
    ],
)
def test_version_2_junk_is_no_position(junk: str) -> None:
    assert decode_pos(junk) is None
