"""`pack_command`: hiredis's packer where it takes the values, ours where it does not,
and the same bytes either way (redis-py's encoding)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import DataError

from router.redis.autopipe import _pack, pack_command

VALUES = st.one_of(
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
)


def test_values_are_packed_as_redis_py_encodes_them() -> None:
    assert pack_command(("SET", "k", "é")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\xc3\xa9\r\n"
    assert pack_command((b"x", 7, 0.5)) == b"*3\r\n$1\r\nx\r\n$1\r\n7\r\n$3\r\n0.5\r\n"
    with pytest.raises(DataError):
        pack_command(("SET", "k", True))


@given(st.lists(VALUES, min_size=1, max_size=12))
def test_hiredis_packs_what_the_reference_packs(args: list[object]) -> None:
    assert pack_command(args) == pack_command(tuple(args)) == _pack(args)


def test_kinds_hiredis_refuses_are_packed_by_the_reference() -> None:
    args = ("SET", bytearray(b"k"), bytearray(b"v"))
    assert pack_command(args) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
    with pytest.raises(DataError):
        pack_command(("SET", "k", None))
