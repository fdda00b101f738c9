"""The pure parts of the bulk read: packing a request, collecting replies from bytes."""

from __future__ import annotations

import hiredis
import pytest

from router.redis.autopipe import ReplyCollector, pack_commands


@pytest.mark.parametrize("keys", [["p:route:alice", "p:b"], ["p:route:zoë", "p:李", "k"]])
def test_packed_commands_are_what_hiredis_packs(keys: list[str]) -> None:
    expected = b"".join(hiredis.pack_command(("HVALS", key)) for key in keys)
    assert pack_commands("HVALS", keys) == expected


def test_packed_commands_parse_back_as_the_commands() -> None:
    # What Redis reads: one array per key, the lengths in bytes.
    reader = hiredis.Reader(encoding="utf-8")
    reader.feed(pack_commands("HGETALL", ["zoë", "a b\r\nc"]))
    assert reader.gets() == ["HGETALL", "zoë"]
    assert reader.gets() == ["HGETALL", "a b\r\nc"]
    assert reader.gets() is False


def test_replies_arrive_in_any_split() -> None:
    wire = b"*1\r\n$5\r\nhello\r\n*0\r\n%1\r\n$1\r\nf\r\n$3\r\nval\r\n"
    for cut in range(1, len(wire)):
        replies = ReplyCollector(3)
        replies.feed(wire[:cut])
        assert not replies.complete or cut == len(wire)
        replies.feed(wire[cut:])
        assert replies.complete and replies.in_sync
        assert replies.replies == [["hello"], [], {"f": "val"}]


def test_push_data_is_skipped_and_marks_the_connection_out_of_sync() -> None:
    replies = ReplyCollector(2)
    replies.feed(b"*1\r\n$1\r\na\r\n>2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n*0\r\n")
    assert replies.complete
    assert replies.replies == [["a"], []]
    assert not replies.in_sync


def test_bytes_past_the_last_reply_mark_the_connection_out_of_sync() -> None:
    replies = ReplyCollector(1)
    replies.feed(b"*0\r\n*1\r\n$1\r")  # the start of a reply nobody asked for
    assert replies.complete and replies.replies == [[]]
    assert not replies.in_sync


def test_error_replies_are_collected_in_place() -> None:
    replies = ReplyCollector(2)
    replies.feed(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n*0\r\n")
    assert isinstance(replies.replies[0], hiredis.ReplyError)
    assert replies.replies[1] == []


def test_bytes_that_are_not_resp_raise() -> None:
    with pytest.raises(hiredis.ProtocolError):
        ReplyCollector(1).feed(b"HTTP/1.1 400 Bad Request\r\n")


@pytest.mark.parametrize("keys", [["u1", "u22"], ["zoë", "李"], []])
def test_a_prefix_is_packed_as_part_of_each_key(keys: list[str]) -> None:
    prefix = "imroute:route:"
    assert pack_commands("HVALS", keys, prefix) == pack_commands(
        "HVALS", [prefix + k for k in keys]
    )
