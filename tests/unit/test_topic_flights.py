"""One read per topic for every resume waiting on it (`TopicSpans`' flights): the widest
range they need, its result or its error shared, a waiter's cancellation its own, and a
read that failed failing the next ones at once for a moment."""

from __future__ import annotations

import asyncio

import pytest

from router.recovery.base import TopicSpan
from shared.clock import ManualClock
from shared.errors import RegistryUnavailable
from socket_gateway import topic_spans
from socket_gateway.resume_budget import ResumeLimits
from socket_gateway.topic_spans import FAIL_FAST_S, IN_MEMORY, TopicSpans
from tests.unit.topic_spans import SIZE, Log, at, seqs, spans


class Failing(Log):
    """A log whose reads wait for `gate`, then fail as a hung shard does."""

    async def read_span(
        self, topic: str, after: int, upto: int | None, max_entries: int, max_bytes: int
    ) -> TopicSpan:
        self.calls.append((after, upto))
        assert self.gate is not None
        await self.gate.wait()
        raise RegistryUnavailable("timed out")


async def test_waiters_nearby_share_one_read_of_the_widest_range() -> None:
    gate = asyncio.Event()
    log = Log(1000, gate=gate)
    s = spans(log, entries=100, bytes=100 * SIZE)
    first = asyncio.ensure_future(s.read("t", at(990), at(1000)))
    await asyncio.sleep(0)
    # 50 more, nearest first, while the first read is under way: they wait together.
    rest = [asyncio.ensure_future(s.read("t", at(990 - k), at(1000))) for k in range(1, 51)]
    await asyncio.sleep(0)
    gate.set()
    got = await asyncio.gather(first, *rest)
    assert len(log.calls) == 2  # the first, then one for all that waited
    assert log.calls[1] == (at(940), at(990))  # the lowest any needed, what was missing
    assert [len(seqs(h)) for h in got] == [10 + k for k in range(51)]


async def test_every_waiter_gets_the_reads_error_and_the_next_fail_at_once() -> None:
    gate = asyncio.Event()
    clock = ManualClock()
    log = Failing(1000, gate=gate)
    s = spans(log, clock)
    waiting = [asyncio.ensure_future(s.read("t", at(990 - k), at(1000))) for k in range(10)]
    await asyncio.sleep(0)
    gate.set()
    got = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(e, RegistryUnavailable) for e in got)
    assert len(log.calls) == 1  # not one after another, each its own timeout
    with pytest.raises(RegistryUnavailable):
        await s.read("t", at(980), at(1000))
    assert len(log.calls) == 1 and s.failed_fast == 1
    clock.advance(FAIL_FAST_S + 0.1)
    with pytest.raises(RegistryUnavailable):
        await s.read("t", at(980), at(1000))
    assert len(log.calls) == 2  # tried again


async def test_a_waiter_cancelled_leaves_the_read_to_the_others() -> None:
    gate = asyncio.Event()
    log = Log(1000, gate=gate)
    s = spans(log)
    first = asyncio.ensure_future(s.read("t", at(990), at(1000)))
    second = asyncio.ensure_future(s.read("t", at(980), at(1000)))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    gate.set()
    assert seqs(await second) == list(range(981, 1001))
    assert first.cancelled() and len(log.calls) == 1
    assert seqs(await s.read("t", at(985), at(1000))) == list(range(986, 1001))
    assert len(log.calls) == 1


async def test_a_log_that_started_again_inside_a_span_drops_it() -> None:
    log = Log(100)
    s = spans(log)
    assert seqs(await s.read("t", at(90), at(100))) == list(range(91, 101))
    log.n, log.epoch = 5, log.epoch + 1  # Redis lost it: a later epoch, from 1 again
    got = await s.read("t", at(95), at(5, log.epoch))
    assert got is not None and [b.seq for b in got.batches] == [
        at(k, log.epoch) for k in range(1, 6)
    ]
    assert log.calls[-1] == (at(0, log.epoch), at(5, log.epoch))
    assert seqs(await s.read("t", at(2, log.epoch), at(5, log.epoch))) == [3, 4, 5]
    assert len(log.calls) == 2  # the new epoch's span answers


async def test_an_empty_log_keeps_no_span() -> None:
    log = Log(0)
    s = spans(log)
    got = await s.read("group.nobody", 0, None)
    assert got is not None and got.batches == []
    assert s._spans == {} and s._next == {} and s._flying == {}


async def test_only_the_gateways_own_topics_keep_a_span_and_all_within_a_memory_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = Log(100)
    s = TopicSpans(log, ManualClock(), ResumeLimits(100, 5000), lambda t: t != "group.other")  # type: ignore[arg-type]
    assert len(seqs(await s.read("group.other", at(90), at(100)))) == 10
    assert "group.other" not in s._spans
    monkeypatch.setattr(topic_spans, "SPANS_MAX_MEMORY", IN_MEMORY * 25 * SIZE)
    for topic in ("b", "o", "g"):
        assert len(seqs(await s.read(topic, at(90), at(100)))) == 10
    assert list(s._spans) == ["o", "g"]
