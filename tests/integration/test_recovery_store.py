"""The recovery store on real Redis, standalone and Cluster: dense sequences, the bounds
in count and time, the inbox, and keys that meet in one slot through hash tags.

Every seq is a log's counter under its epoch (`shared.positions.seq_of`): the counters
are the dense 1, 2, 3 ... of one log; `at(s, n)` names entry n of the log `s` is in."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from router.recovery.base import RecoveryLimits
from router.recovery.store import RedisRecoveryStore, encode_message
from router.redis.client import RedisClient, connect_redis
from shared.batches import to_batch
from shared.clock import ManualClock
from shared.keys import KeySchema
from shared.models import Message
from shared.positions import counter_of, epoch_of, seq_of
from shared.proto import gateway_pb2
from tests.integration.recovery_helpers import write_legacy

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000


def msg(n: int, ts: int = T0) -> Message:
    return Message(f"m{n}", f"p{n}", 1, "admin", b'{"n":%d}' % n, ts)


@pytest.fixture(params=["standalone", "cluster"])
async def client(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[RedisClient]:
    url = request.getfixturevalue("cluster_url") if request.param == "cluster" else redis_url
    async with connect_redis(url) as c:
        yield c


def at(seq: int, n: int) -> int:
    """Entry `n` of the log whose entry `seq` is (same epoch)."""
    return seq_of(epoch_of(seq), n)


def counters(seqs: list[int]) -> list[int]:
    return [counter_of(s) for s in seqs]


def store(
    client: RedisClient, prefix: str, clock: ManualClock, **limits: float
) -> RedisRecoveryStore:
    return RedisRecoveryStore(client, KeySchema(prefix), clock, RecoveryLimits(**limits))  # type: ignore[arg-type]


async def append(
    s: RedisRecoveryStore, message: Message, uids: list[str], expires_ms: int
) -> list[int]:
    """`message` logged for each of `uids` (into their inboxes too); their seqs."""
    seqs, _ = await s.append_queued(message, uids, expires_ms)
    return seqs


async def test_p2p_logs_are_dense_per_user_and_read_after_a_position(
    client: RedisClient, prefix: str
) -> None:
    clock = ManualClock(T0)
    s = store(client, prefix, clock)
    # Uids that land in many slots, and ones with braces (tagged by their hash).
    uids = ["a", "b", "{x}", "}y{", "ünï"]
    first = await append(s, msg(1), uids, 0)
    assert counters(first) == [1] * 5 and all(epoch_of(seq) > 0 for seq in first)
    a1 = first[0]
    assert counters(await append(s, msg(2), uids[:2], T0 + 5)) == [2, 2]
    assert await append(s, msg(3), ["a"], 0) == [at(a1, 3)]
    h = await s.read_user("a", a1)
    assert h.head == at(a1, 3)
    assert [(e.seq, e.message.msg_id) for e in h.log] == [(at(a1, 2), "m2"), (at(a1, 3), "m3")]
    assert h.log[0].expires_ms == T0 + 5 and h.log[0].message == msg(2)
    assert (await s.read_user("a", at(a1, 3))).log == []
    assert (await s.read_user("a", None)).log == []
    assert (await s.read_user("}y{", 0)).head == first[3]
    assert (await s.read_user("nobody", 0)).head == 0


async def test_a_log_keeps_its_bounds_in_count_and_in_time(
    client: RedisClient, prefix: str
) -> None:
    clock = ManualClock(T0)
    s = store(client, prefix, clock, user_max=3, window_s=10, inbox_max=2, inbox_ttl_s=60)
    for n in range(1, 6):
        await append(s, msg(n), ["u"], 0)
    assert counters([e.seq for e in (await s.read_user("u", 0)).log]) == [3, 4, 5]  # count
    clock.advance(11)
    (six,) = await append(s, msg(6), ["u"], 0)
    assert counters([e.seq for e in (await s.read_user("u", 0)).log]) == [6]  # time
    # What no device acked stays, as the inbox, for the inbox TTL. Past the window, what
    # is out of the inbox leaves: 1-3 by the count, 4 behind the inbox's bound of 2.
    log_key = KeySchema(prefix).user_log("u")
    assert [counter_of(e.seq) for e in (await s.read_user("u", None)).inbox] == [5, 6]
    assert 10_000 < await client.pttl(log_key) <= 75_000  # the inbox TTL, a quarter more
    await s.ack([("u", six)])  # everything acked: the log serves resumes only
    ttl = await client.pttl(log_key)
    assert 0 < ttl <= 10_000  # the whole log lapses one window after its last ack
    # The sequence keeps its own TTL: a position stays valid past the log.
    assert await client.pttl(KeySchema(prefix).user_seq("u")) > 60_000


async def test_an_append_sets_the_ttls_again_only_once_a_quarter_is_used_up(
    client: RedisClient, prefix: str
) -> None:
    clock = ManualClock(T0)
    s = store(client, prefix, clock, window_s=10, inbox_ttl_s=100, receipts_ttl_s=100)
    seq_key, log_key = KeySchema(prefix).user_seq("u"), KeySchema(prefix).user_log("u")
    await append(s, msg(1), ["u"], 0)
    assert 100_000 < await client.pttl(log_key) <= 125_000
    seq_ttl = await client.pttl(seq_key)
    assert s.limits.user_seq_ttl_ms < seq_ttl <= s.limits.user_seq_ttl_ms * 5 // 4
    # Marked short: an append inside the first quarter sets neither again...
    await client.pexpire(log_key, 50_000)
    await client.pexpire(seq_key, 50_000)
    clock.advance(20)
    await append(s, msg(2), ["u"], 0)
    assert await client.pttl(log_key) <= 50_000
    assert await client.pttl(seq_key) <= 50_000
    # ... one past it sets both (each deadline then ends sooner than needed).
    clock.advance(10)
    (three,) = await append(s, msg(3), ["u"], 0)
    assert 100_000 < await client.pttl(log_key) <= 125_000
    assert s.limits.user_seq_ttl_ms < await client.pttl(seq_key)
    # Everything acked: the log lapses one window after; the next append keeps it again.
    await s.ack([("u", three)])
    assert await client.pttl(log_key) <= 10_000
    await append(s, msg(4), ["u"], 0)
    assert 100_000 < await client.pttl(log_key) <= 125_000
    # A log Redis lost (the sequence kept) gets its TTL with its first entry.
    await client.delete(log_key)
    await append(s, msg(5), ["u"], 0)
    assert 100_000 < await client.pttl(log_key) <= 125_000


async def test_while_legacy_writes_run_every_append_sets_the_ttls_and_no_deadline(
    client: RedisClient, prefix: str
) -> None:
    """A push service of the version before shortens the TTLs behind the deadlines'
    back: while legacy writes say one may run, each append sets both TTLs and records no
    deadline (0), so the first append after them sets the TTLs again too."""
    clock = ManualClock(T0)
    limits = {"window_s": 10, "inbox_ttl_s": 100, "receipts_ttl_s": 100}
    both = store(client, prefix, clock, legacy_writes=True, **limits)
    seq_key, log_key = KeySchema(prefix).user_seq("u"), KeySchema(prefix).user_log("u")
    for n in (1, 2):
        await append(both, msg(n), ["u"], 0)
        assert await client.hmget(seq_key, ["x", "y"]) == ["0", "0"]
        await client.pexpire(log_key, 5_000)  # what the version before's append does
        await client.pexpire(seq_key, 5_000)
    await append(store(client, prefix, clock, **limits), msg(3), ["u"], 0)
    assert 100_000 < await client.pttl(log_key) <= 125_000
    assert both.limits.user_seq_ttl_ms < await client.pttl(seq_key)


async def test_a_deadline_no_writer_could_set_is_set_again(
    client: RedisClient, prefix: str
) -> None:
    """A push service whose clock runs ahead writes deadlines past what the others would
    set; theirs set the TTLs again rather than trust them."""
    limits = {"window_s": 10, "inbox_ttl_s": 100, "receipts_ttl_s": 100}
    ahead = store(client, prefix, ManualClock(T0 + 3_600_000), **limits)
    seq_key, log_key = KeySchema(prefix).user_seq("u"), KeySchema(prefix).user_log("u")
    await append(ahead, msg(1), ["u"], 0)
    await client.pexpire(log_key, 5_000)
    await client.pexpire(seq_key, 5_000)
    await append(store(client, prefix, ManualClock(T0), **limits), msg(2), ["u"], 0)
    assert 100_000 < await client.pttl(log_key) <= 125_000
    assert await client.pttl(seq_key) > 100_000


async def test_an_old_inbox_entry_the_acked_position_covers_is_not_read(
    client: RedisClient, prefix: str
) -> None:
    """A push service of the version before may add to a legacy inbox an ack no longer
    clears (`l` gone): what the acked position covers is not read from it."""
    s = store(client, prefix, ManualClock(T0))
    names = KeySchema(prefix).user_keys("u")
    (one,), _ = await s.append_queued(msg(1), ["u"], 0)
    (two,), _ = await s.append_queued(msg(2), ["u"], 0)
    await s.ack([("u", one)])
    await client.zadd(names[2], {"[1," + encode_message(msg(1), 0)[3:]: 1})
    await client.zadd(names[2], {"[2," + encode_message(msg(2), 0)[3:]: 2})
    inbox = (await s.read_user("u", None)).inbox
    assert [(counter_of(e.seq), e.message) for e in inbox] == [(2, msg(2))]
    await s.ack([("u", two)])
    assert (await s.read_user("u", None)).inbox == []


async def test_the_inbox_holds_its_bound_and_forgets_what_was_acked(
    client: RedisClient, prefix: str
) -> None:
    s = store(client, prefix, ManualClock(T0), inbox_max=3)
    for n in range(1, 6):
        (seq,), dropped = await s.append_queued(msg(n), ["i"], 0)
        assert dropped == (1 if n > 3 else 0)
    h = await s.read_user("i", None)
    assert counters([e.seq for e in h.inbox]) == [3, 4, 5] and h.inbox[0].message == msg(3)
    await s.ack([("i", at(seq, 3))])
    assert counters([e.seq for e in (await s.read_user("i", None)).inbox]) == [4, 5]
    # Two devices acking out of step: the furthest ack holds; one behind it moves
    # nothing back, nor does one past the head move it further than the head.
    await s.ack([("i", at(seq, 5)), ("i", at(seq, 4))])
    assert (await s.read_user("i", None)).inbox == []
    await s.ack([("i", at(seq, 2))])
    assert (await s.read_user("i", None)).inbox == []
    await s.ack([("i", at(seq, 99))])
    (six,), dropped = await s.append_queued(msg(6), ["i"], 0)
    assert counter_of(six) == 6 and dropped == 0
    assert [e.message for e in (await s.read_user("i", None)).inbox] == [msg(6)]


async def test_an_inbox_written_before_it_was_the_logs_is_read_and_acked(
    client: RedisClient, prefix: str
) -> None:
    """An upgrade: an offline user's messages queued by the version before (the log and
    an inbox of its own) reach the next connection, with what came after, once each;
    what a gateway of the version before acked (out of the old inbox only) does not come
    back; an ack takes them out of the old inbox; and while push services of the
    version before run, the new ones write the old inbox too."""
    s = store(client, prefix, ManualClock(T0))
    k = KeySchema(prefix)
    names = k.user_keys("u")
    for n in (1, 2, 3):
        assert await write_legacy(client, *names, msg(n), 0) == n
    # The version before's log holds all three: its inbox alone says what waits.
    assert [e.message for e in (await s.read_user("u", None)).inbox] == [msg(1), msg(2), msg(3)]
    await client.zremrangebyscore(names[2], 1, 1)  # an old gateway's ack of 1
    assert [e.message for e in (await s.read_user("u", None)).inbox] == [msg(2), msg(3)]
    (four,), _ = await s.append_queued(msg(4), ["u"], 0)
    got = [(counter_of(e.seq), e.message) for e in (await s.read_user("u", None)).inbox]
    assert got == [(2, msg(2)), (3, msg(3)), (4, msg(4))]
    await client.ltrim(names[1], -1, -1)  # the log without 1-3: the old inbox keeps them
    assert [e.message for e in (await s.read_user("u", None)).inbox] == [msg(2), msg(3), msg(4)]
    await s.ack([("u", at(four, 2))])
    assert await client.zrangebyscore(names[2], "-inf", "+inf") == [
        "[3," + encode_message(msg(3), 0)[3:]
    ]
    assert [e.message for e in (await s.read_user("u", None)).inbox] == [msg(3), msg(4)]
    assert await client.hget(names[0], "l") == "1"  # its acks clear the old inbox too
    await s.ack([("u", four)])
    assert await client.zcard(names[2]) == 0
    assert await client.hget(names[0], "l") is None  # empty: later acks leave it be
    assert (await s.read_user("u", None)).inbox == []
    await s.append_queued(msg(9), ["new"], 0)  # a user the version before never had
    assert await client.hget(k.user_seq("new"), "l") is None
    # IMROUTE_INBOX_LEGACY_WRITES: the old inbox written too, for the version before.
    both = store(client, prefix, ManualClock(T0), legacy_writes=True)
    (five,), _ = await both.append_queued(msg(5), ["u"], 0)
    assert await client.zrangebyscore(names[2], "-inf", "+inf") == [
        f"[{counter_of(five)}," + encode_message(msg(5), 0)[3:]
    ]
    assert [e.message for e in (await s.read_user("u", None)).inbox] == [msg(5)]
    assert await client.hget(names[0], "l") == "1"
    await s.ack([("u", five)])
    assert await client.zcard(names[2]) == 0
    assert await client.hget(names[0], "l") is None
    # A push service of the version before, still running, adds one: an ack no longer
    # takes it out of the old inbox, but the acked position covers it.
    six = await write_legacy(client, *names, msg(6), 0)
    assert [e.message for e in (await s.read_user("u", None)).inbox] == [msg(6)]
    await s.ack([("u", at(five, six))])
    assert await client.zcard(names[2]) == 1
    assert (await s.read_user("u", None)).inbox == []


async def test_topic_logs_read_by_range_and_their_sequence_never_lapses(
    client: RedisClient, prefix: str
) -> None:
    clock = ManualClock(T0)
    s = store(client, prefix, clock, topic_max=10)
    for n in range(1, 13):
        b = to_batch(msg(n), [f"u{n}", "all"], f"batch-{n}")
        b.mode = gateway_pb2.MODE_MULTICAST
        b.group_id = "g1"
        seq = await s.append_batch("group.g1", b)
        assert counter_of(seq) == n
    h = await s.read_topic("group.g1", at(seq, 8))
    assert h.head == at(seq, 12) and counters([b.seq for b in h.batches]) == [9, 10, 11, 12]
    first = h.batches[0].batch
    assert list(first.uids) == ["u9", "all"] and first.batch_id == "batch-9"
    assert first.group_id == "g1" and first.mode == gateway_pb2.MODE_MULTICAST
    assert (first.seq, first.epoch) == (9, epoch_of(seq))  # as the bus carries it
    window = (await s.read_topic("group.g1", at(seq, 4), at(seq, 6))).batches
    assert counters([b.seq for b in window]) == [5, 6]
    everything = (await s.read_topic("group.g1", 0)).batches
    assert counters([b.seq for b in everything]) == list(range(3, 13))
    assert (await s.read_topic("group.g1", at(seq, 12))).batches == []
    assert await s.heads(["group.g1", "broadcast"]) == [at(seq, 12), 0]
    assert await client.pttl(KeySchema(prefix).topic_seq("group.g1")) == -1


async def test_a_budgeted_read_of_a_topic_log_stops_at_its_budget(
    client: RedisClient, prefix: str
) -> None:
    """`read_span`: the batches in range, with each entry's bytes, and no content filled
    in; over the budget (in batches, or in bytes: read backward from the top, stopped
    at the first entry past it), only the newest that fit, marked over, with where they
    start. A log trimmed under the range gives what it still holds."""
    s = store(client, prefix, ManualClock(T0), topic_max=150)
    for n in range(1, 201):
        b = to_batch(msg(n), [f"u{n:03d}"], f"batch-{n}")
        seq = await s.append_batch("group.g1", b)
    entry = len(await client.lindex(KeySchema(prefix).topic_log("group.g1"), -1))  # type: ignore[misc]
    got = await s.read_span("group.g1", at(seq, 190), None, 100, 10 * entry)
    assert not got.over and got.head == at(seq, 200)
    assert counters([b.seq for b in got.batches]) == list(range(191, 201))
    assert got.sizes == [entry] * 10
    over = await s.read_span("group.g1", at(seq, 189), at(seq, 200), 100, 10 * entry)
    assert over.over and over.head == at(seq, 200) and over.start == at(seq, 190)
    assert counters([b.seq for b in over.batches]) == list(range(191, 201))  # what fits
    many = await s.read_span("group.g1", at(seq, 100), at(seq, 200), 99, 10**9)
    assert many.over and many.start == at(seq, 101)  # 100 batches: over 99, the newest
    assert counters([b.seq for b in many.batches]) == list(range(102, 201))
    # Trimmed to 150: from position 0 it is the 150 kept, over several chunks of 64.
    whole = await s.read_span("group.g1", 0, at(seq, 200), 1000, 10**9)
    assert counters([b.seq for b in whole.batches]) == list(range(51, 201))
    stopped = await s.read_span("group.g1", 0, at(seq, 200), 1000, 100 * entry)
    assert stopped.over and stopped.start == at(seq, 100)
    assert counters([b.seq for b in stopped.batches]) == list(range(101, 201))


async def test_a_log_redis_lost_starts_again_under_a_later_epoch(
    client: RedisClient, prefix: str
) -> None:
    """What a Redis restarted empty does to a log (its keys deleted here, on a live
    server): the counter starts at 1 again, under an epoch after the lost one, so every
    new seq is above every old one; a position in the lost log reads the new one whole,
    and acks numbered in the lost log touch nothing of the new one."""
    s = store(client, prefix, ManualClock(T0))
    k = KeySchema(prefix)
    old = [(await s.append_queued(msg(n), ["u"], 0))[0][0] for n in (1, 2, 3)]
    t = [await s.append_batch("broadcast", to_batch(msg(n), ["u"], f"b{n}")) for n in (1, 2)]
    await client.delete(k.user_seq("u"), k.user_log("u"), k.user_inbox("u"))
    await client.delete(k.topic_seq("broadcast"), k.topic_log("broadcast"))
    assert (await s.read_user("u", old[-1])).head == 0  # gone: a position past the head
    assert await s.heads(["broadcast"]) == [0]
    (new,), _ = await s.append_queued(msg(4), ["u"], 0)
    assert counter_of(new) == 1 and epoch_of(new) > epoch_of(old[0]) and new > old[-1]
    h = await s.read_user("u", old[-1])  # from the lost epoch: the new log, whole
    assert h.head == new and [e.message.msg_id for e in h.log] == ["m4"]
    await s.ack([("u", old[1]), ("u", seq_of(epoch_of(old[0]), 1))])  # the lost log's
    assert [e.message.msg_id for e in (await s.read_user("u", None)).inbox] == ["m4"]
    t3 = await s.append_batch("broadcast", to_batch(msg(3), ["u"], "b3"))
    assert counter_of(t3) == 1 and t3 > t[-1] and await s.heads(["broadcast"]) == [t3]
    assert [b.seq for b in (await s.read_topic("broadcast", t[-1])).batches] == [t3]
    assert (await s.read_topic("broadcast", t[0], t[1])).batches == []  # an older epoch
