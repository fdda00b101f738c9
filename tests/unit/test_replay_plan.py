"""Replay planning: what is sent on resume, in which order, and when it is complete."""

from __future__ import annotations

from router.recovery.base import Entry, LoggedBatch, TopicHistory, UserHistory
from router.recovery.replay import plan_replay
from shared.models import Message
from shared.positions import Pos, seq_of
from shared.proto import gateway_pb2

NOW = 1_800_000_000_000
WINDOW = 300_000
INBOX_TTL = 86_400_000


def msg(n: int, ts: int | None = None) -> Message:
    return Message(f"m{n}", f"p{n}", 0, "admin", b"%d" % n, NOW - 10_000 + n if ts is None else ts)


def entry(seq: int, n: int | None = None, **kw: int) -> Entry:
    return Entry(seq, msg(seq if n is None else n, kw.get("ts")), kw.get("expires", 0))


def batch(
    seq: int, n: int, uids: list[str], everyone: bool = False, ts: int | None = None
) -> LoggedBatch:
    m = msg(n, ts)
    return LoggedBatch(
        gateway_pb2.Batch(
            batch_id=f"b{seq}",
            message=gateway_pb2.Message(
                msg_id=m.msg_id, push_id=m.push_id, content_json=m.content_json, ts_ms=m.ts_ms
            ),
            uids=uids,
            everyone=everyone,
            seq=seq,
        )
    )


def plan(
    since: Pos | None, user: UserHistory, topics: dict[str, TopicHistory] | None = None, **kw: bool
):  # type: ignore[no-untyped-def]
    return plan_replay("amy", since, user, topics or {}, NOW, WINDOW, INBOX_TTL, **kw)


def test_p2p_after_the_position_in_seq_order_then_complete() -> None:
    user = UserHistory(5, [entry(3), entry(4), entry(5)])
    r = plan(Pos(p=2), user)
    assert [(i.log, i.seq) for i in r.items] == [("p", 3), ("p", 4), ("p", 5)]
    assert r.complete


def test_a_hole_in_the_log_makes_it_incomplete() -> None:
    r = plan(Pos(p=2), UserHistory(5, [entry(3), entry(5)]))
    assert [i.seq for i in r.items] == [3, 5] and not r.complete


def test_a_position_ahead_of_the_log_is_unknown() -> None:
    r = plan(Pos(p=9), UserHistory(5, []))
    assert r.items == [] and not r.complete


def test_out_of_the_window_is_left_out_and_incomplete() -> None:
    old = entry(3, ts=NOW - WINDOW - 1)
    r = plan(Pos(p=2), UserHistory(4, [old, entry(4)]))
    assert [i.seq for i in r.items] == [4] and not r.complete


def test_an_expired_message_is_never_sent_and_does_not_make_it_incomplete() -> None:
    r = plan(Pos(p=0), UserHistory(2, [entry(1, expires=NOW - 1), entry(2)]))
    assert [i.seq for i in r.items] == [2] and r.complete and r.expired == 1
    assert r.expired_ids == {}  # not in the inbox: another device acked it


TAGGED = "0123456789abcdef0123456789abcdef.{:03d}"  # a stored, listable P2P push's id


def tagged(seq: int, expires: int = 0) -> Entry:
    m = Message(f"m{seq}", TAGGED.format(seq), 0, "admin", b"1", NOW - 10_000 + seq)
    return Entry(seq, m, expires)


def test_an_expired_inbox_message_is_counted_once_and_marked_unless_covered() -> None:
    """Left out for its ttl_s, an inbox entry the client's position does not cover is
    named for its receipt's expired mark; counted once though it is in the log too."""
    covered, gone, plain = tagged(2, NOW - 1), tagged(3, NOW - 1), entry(4, expires=NOW - 1)
    user = UserHistory(5, [covered, gone, plain, entry(5)], inbox=[covered, gone, plain, entry(5)])
    r = plan(Pos(p=2), user)
    assert [i.seq for i in r.items] == [5] and r.expired == 3
    assert list(r.expired_ids) == [TAGGED.format(3), "p4"]


def test_the_inbox_joins_without_duplicates_and_stays_until_acked() -> None:
    user = UserHistory(4, [entry(3), entry(4)], inbox=[entry(3), entry(4)])
    r = plan(Pos(p=2), user)
    assert [i.seq for i in r.items] == [3, 4]
    assert r.inbox_covered == []  # sent, not acked: they stay
    r = plan(None, user)
    assert [i.seq for i in r.items] == [3, 4]  # a new connection: the whole inbox


def test_without_since_only_the_inbox_and_stale_inbox_entries_are_dropped() -> None:
    user = UserHistory(
        4, [], inbox=[entry(1, ts=NOW - INBOX_TTL - 1), entry(2), entry(3, expires=NOW - 5)]
    )
    r = plan(None, user)
    assert [i.seq for i in r.items] == [2] and r.complete  # 2 waits for its ack
    assert r.expired == 1  # 1 (past the inbox TTL) and 3 (its ttl_s) are never sent


def test_a_malformed_since_is_incomplete_but_still_gets_the_inbox() -> None:
    r = plan(None, UserHistory(1, [], inbox=[entry(1)]), since_valid=False)
    assert [i.seq for i in r.items] == [1] and not r.complete


def test_batches_addressed_to_the_user_merge_with_p2p_by_time() -> None:
    user = UserHistory(2, [entry(1, ts=NOW - 500), entry(2, ts=NOW - 100)])
    topics = {
        "b": TopicHistory(
            12, [batch(11, 90, ["bob"], ts=NOW - 400), batch(12, 91, ["amy", "x"], ts=NOW - 300)]
        ),
        "g": TopicHistory(3, [batch(3, 92, [], everyone=True, ts=NOW - 200)]),
        "o": TopicHistory(7, [batch(7, 93, ["amy"], ts=NOW - 50)]),
    }
    r = plan(Pos(p=0, b=10, o=6, group="g1", g=2), user, topics)
    assert [(i.log, i.seq) for i in r.items] == [("p", 1), ("b", 12), ("g", 3), ("p", 2), ("o", 7)]
    assert r.complete


def test_a_topic_hole_makes_it_incomplete_even_if_not_addressed() -> None:
    topics = {"b": TopicHistory(12, [batch(12, 1, ["amy"])])}  # 11 is gone
    r = plan(Pos(b=10), UserHistory(0), topics)
    assert [i.seq for i in r.items] == [12] and not r.complete


def test_another_users_batches_give_nothing() -> None:
    topics = {"b": TopicHistory(2, [batch(1, 1, ["bob"]), batch(2, 2, ["bob"])])}
    r = plan(Pos(b=0), UserHistory(0), topics)
    assert r.items == [] and r.complete


def test_a_position_acks_the_inbox_entries_it_covers() -> None:
    user = UserHistory(4, [entry(4)], inbox=[entry(1), entry(3), entry(4)])
    r = plan(Pos(p=3), user)
    assert [i.seq for i in r.items] == [4]  # what comes after the position, as before
    assert [e.seq for e in r.inbox_covered] == [1, 3]  # the client had them: acked
    # A position from a log that is gone (past the head) covers nothing.
    r = plan(Pos(p=9), UserHistory(2, [], inbox=[entry(1), entry(2)]))
    assert [i.seq for i in r.items] == [1, 2] and r.inbox_covered == []


def test_a_position_in_a_log_redis_lost_is_incomplete_and_gets_the_new_log() -> None:
    """The user's log started again (n 1, 2) under a later epoch: the position (n 7 of
    the old one) covers none of it, and cannot say what it missed of the old one."""
    old, new = 100, 200
    user = UserHistory(seq_of(new, 2), [entry(seq_of(new, 1), 1), entry(seq_of(new, 2), 2)])
    r = plan(Pos(p=seq_of(old, 7)), user)
    assert [i.seq for i in r.items] == [seq_of(new, 1), seq_of(new, 2)] and not r.complete


def test_a_position_before_any_entry_is_complete_with_a_log_of_any_epoch() -> None:
    user = UserHistory(seq_of(200, 2), [entry(seq_of(200, 1), 1), entry(seq_of(200, 2), 2)])
    first = batch(1, 9, ["amy"]).batch
    first.epoch = 300  # n 1 of a broadcast log born at 300
    r = plan(Pos(), user, {"b": TopicHistory(seq_of(300, 1), [LoggedBatch(first)])})
    assert len(r.items) == 3 and r.complete
