"""Topic-log reads for resumes: shared by range (one read per stretch of a log, what is
missing read alone), single flight, and held to the budget from the head, against an
in-memory log that answers `read_span` as the Lua script does."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from router.recovery.base import TopicHistory
from shared.clock import ManualClock
from shared.positions import counter_of
from shared.proto import gateway_pb2
from socket_gateway.fill_content import fill_for
from socket_gateway.topic_spans import SPAN_TTL_S
from tests.unit.topic_spans import SIZE, E, Log, at, logged_batch, seqs, spans


async def test_a_range_inside_what_was_read_reads_nothing_more() -> None:
    log = Log(100)
    s = spans(log)
    assert seqs(await s.read("t", at(80), at(100))) == list(range(81, 101))
    assert seqs(await s.read("t", at(90), at(100))) == list(range(91, 101))
    assert seqs(await s.read("t", at(85), at(95))) == list(range(86, 96))
    assert log.calls == [(at(80), at(100))] and s.reads == 1


async def test_a_range_that_reaches_further_reads_only_what_is_missing() -> None:
    log = Log(100)
    s = spans(log)
    await s.read("t", at(80), at(90))
    log.n = 110  # the log moved on
    assert seqs(await s.read("t", at(85), at(110))) == list(range(86, 111))
    assert seqs(await s.read("t", at(70), at(100))) == list(range(71, 101))
    assert log.calls == [(at(80), at(90)), (at(90), at(110)), (at(70), at(80))]
    assert log.sent == 40 * SIZE  # each entry once


async def test_resumes_that_arrive_together_share_one_read() -> None:
    gate = asyncio.Event()
    log = Log(100, gate=gate)
    s = spans(log)
    tasks = [asyncio.create_task(s.read("t", at(100 - k), at(100))) for k in range(1, 21)]
    await asyncio.sleep(0.01)
    gate.set()
    got = await asyncio.gather(*tasks)
    assert [len(seqs(h)) for h in got] == list(range(1, 21))
    # The first read brings (99, 100]; every later one only what lies below the last.
    assert log.sent == 20 * SIZE


async def test_over_the_batches_behind_the_head_nothing_is_read() -> None:
    log = Log(1000)
    s = spans(log, entries=100, bytes=100 * SIZE)
    assert await s.read("t", at(899), at(1000)) is None
    assert await s.read("t", 0, at(1000)) is None  # from the start: 1000 behind
    assert log.calls == []
    assert seqs(await s.read("t", at(900), at(1000))) == list(range(901, 1001))


async def test_over_the_bytes_the_newest_that_fit_are_kept_and_below_them_is_over() -> None:
    log = Log(100)
    s = spans(log, bytes=20 * SIZE)
    assert await s.read("t", at(70), at(100)) is None  # 30 entries: over 20's bytes
    assert log.sent == 20 * SIZE  # read backward from the head: what fits, no more
    assert seqs(await s.read("t", at(85), at(100))) == list(range(86, 101))
    assert seqs(await s.read("t", at(80), at(95))) == list(range(81, 96))
    assert await s.read("t", at(75), at(100)) is None  # below where the budget ran out
    assert await s.read("t", at(79), at(100)) is None
    assert len(log.calls) == 1 and log.sent == 20 * SIZE


async def test_a_position_at_or_past_the_head_or_of_a_later_epoch_reads_nothing() -> None:
    log = Log(100)
    s = spans(log)
    assert seqs(await s.read("t", at(100), at(100))) == []
    assert seqs(await s.read("t", at(150), at(100))) == []
    assert seqs(await s.read("t", at(5, E + 1), at(100))) == []
    assert log.calls == []


async def test_a_position_of_an_older_epoch_reads_the_new_log_from_its_start() -> None:
    log = Log(30, epoch=E + 1)
    s = spans(log)
    got = await s.read("t", at(500), at(30, E + 1))
    assert seqs(got) == list(range(1, 31))


async def test_a_span_lapses_after_its_ttl_and_the_tail_reads_to_the_head() -> None:
    clock = ManualClock()
    log = Log(100)
    s = spans(log, clock)
    await s.read("t", at(90), at(100))
    log.n = 105
    assert seqs(await s.read("t", at(95), None)) == list(range(96, 101))  # fresh: as read
    clock.advance(SPAN_TTL_S / 2 + 0.1)
    assert seqs(await s.read("t", at(95), at(100))) == list(range(96, 101))  # used: kept
    clock.advance(SPAN_TTL_S / 2 + 0.1)  # its `hi` is older than the ttl now
    assert seqs(await s.read("t", at(95), None)) == list(range(96, 106))
    assert log.calls[-1] == (at(100), None)  # only what it lacked
    clock.advance(SPAN_TTL_S + 0.1)
    await s.read("t", at(95), at(105))
    assert log.calls[-1] == (at(95), at(105))  # unused too long: read again


async def test_what_a_span_holds_stays_within_twice_the_budget() -> None:
    log = Log(100)
    s = spans(log, entries=10, bytes=10 * SIZE)
    for head in range(10, 101, 10):
        log.n = head
        assert len(seqs(await s.read("t", at(head - 10), at(head)))) == 10
    span = s._spans["t"]
    assert len(span.batches) <= 20 and span.cum[-1] <= 20 * SIZE
    assert counter_of(span.lo) >= 80


class Contents:
    def __init__(self, gone: Sequence[str] = ()) -> None:
        self.gone, self.asked = set(gone), []

    async def fill_content(self, batches: Sequence[gateway_pb2.Batch]) -> list[bool]:
        self.asked.append([b.message.msg_id for b in batches])
        for b in batches:
            b.message.content_json = b"" if b.message.msg_id in self.gone else b'"x"'
        return [b.message.msg_id not in self.gone for b in batches]


async def test_stored_content_is_read_only_for_the_batches_that_name_the_user() -> None:
    mine, theirs, gone = (
        logged_batch(at(k), [u], stored=True) for k, u in ((1, "u1"), (2, "u2"), (3, "u1"))
    )
    contents = Contents(gone=[f"m{at(3)}"])
    history = TopicHistory(at(3), [mine, theirs, gone])
    got = await fill_for(contents, "u1", {"g": history})  # type: ignore[arg-type]
    assert contents.asked == [[f"m{at(1)}", f"m{at(3)}"]]  # not u2's
    assert [b.seq for b in got["g"].batches] == [at(1), at(2)]  # u1's gone one: a hole
    assert got["g"].batches[0].message.content_json == b'"x"'
    assert got["g"].batches[1] is theirs
    # Filled in a copy: the batch the span holds (every resume's) stays as read.
    assert mine.batch.message.content_json == b"" and got["g"].batches[0] is not mine
    assert got["g"].batches[0].addresses("u1") and not got["g"].batches[0].addresses("u2")


async def test_a_range_found_over_the_budget_is_not_read_again_nor_any_that_holds_it() -> None:
    clock = ManualClock()
    log = Log(100)
    s = spans(log, clock, bytes=20 * SIZE)
    assert await s.read("t", at(50), at(100)) is None
    assert len(log.calls) == 1
    log.n = 101  # the head moved on: a range that holds the one found over
    for after in (at(50), at(10), 0, at(60), at(79)):  # any place below where it ran out
        assert await s.read("t", after, at(101)) is None
    assert len(log.calls) == 1
    assert len(seqs(await s.read("t", at(90), at(101)))) == 11  # within: read as ever
    assert log.calls[-1] == (at(100), at(101))  # only what the span lacked
    clock.advance(SPAN_TTL_S + 0.1)
    assert await s.read("t", at(50), at(101)) is None
    assert len(log.calls) == 3  # forgotten: read (and refused) again
