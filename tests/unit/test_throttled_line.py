"""A throttled log line (shared.throttled.ThrottledLine): at most one line per window
with the count since the last, and what a window held back said when it ends, so a
burst that stops is said whole (the operator's trial: "1 entries" logged while 787
were counted, the rest only at the next loss, if ever)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from shared.logs import JsonFormatter, log_context
from shared.throttled import ThrottledLine, say_held

log = logging.getLogger("tests.throttled")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fast_timers(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The lines' timers on the running loop fire after 10 ms; returns the delays they
    asked for."""
    loop = asyncio.get_running_loop()
    waits: list[float] = []
    real = loop.call_later

    def soon(delay: float, callback: Any, *args: object, **kw: Any) -> asyncio.TimerHandle:
        if isinstance(getattr(callback, "__self__", None), ThrottledLine):
            waits.append(delay)
            delay = 0.01
        return real(delay, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_later", soon)
    return waits


async def test_a_burst_is_said_whole_at_the_end_of_its_window(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    waits = fast_timers(monkeypatch)
    line = ThrottledLine(log, "refused %(n)d (%(total)d in all), the last from %(peer)s", now=clock)
    with caplog.at_level(logging.WARNING):
        line.note(peer="a")
        clock.t += 0.5
        for i in range(786):
            line.note(peer=f"b{i}")
        assert [r.getMessage() for r in caplog.records] == ["refused 1 (1 in all), the last from a"]
        assert waits == [9.5]  # one timer, for the end of the first line's window
        clock.t += 9.5
        await asyncio.sleep(0.05)
    assert [r.getMessage() for r in caplog.records][1:] == [
        "refused 786 (787 in all), the last from b785"
    ]
    assert line.total == 787


async def test_a_clock_behind_the_loop_s_is_waited_for(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    waits = fast_timers(monkeypatch)
    line = ThrottledLine(log, "lost %(n)d", every_s=10.0, now=clock)
    with caplog.at_level(logging.WARNING):
        line.note()
        line.note(5)
        await asyncio.sleep(0.05)  # the timer fired, but this clock is 10 s short
        assert len(caplog.records) == 1 and len(waits) > 1 and set(waits) == {10.0}
        clock.t += 10.0
        await asyncio.sleep(0.05)
    assert [r.getMessage() for r in caplog.records] == ["lost 1", "lost 5"]


async def test_the_traceback_of_the_last_occurrence_goes_with_a_held_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    fast_timers(monkeypatch)
    line = ThrottledLine(log, "failed %(n)d time(s)", level=logging.ERROR, now=clock)
    with caplog.at_level(logging.ERROR):
        line.note(exc_info=ValueError("first"))
        line.note(exc_info=KeyError("second"))
        clock.t += 10.0
        await asyncio.sleep(0.05)
    records = caplog.records
    assert [r.getMessage() for r in records] == ["failed 1 time(s)", "failed 1 time(s)"]
    assert [type(r.exc_info[1]) for r in records if r.exc_info] == [ValueError, KeyError]
    assert all(r.levelno == logging.ERROR for r in records)


def test_without_a_running_loop_what_is_held_back_waits_for_the_next_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    line = ThrottledLine(log, "refused %(n)d", now=clock)
    with caplog.at_level(logging.WARNING):
        line.note()
        line.note(3)  # no loop to set a timer on
        clock.t += 10.0
        line.note()
    assert [r.getMessage() for r in caplog.records] == ["refused 1", "refused 4"]


def test_a_field_holding_a_percent_sign_is_said_as_it_is(caplog: pytest.LogCaptureFixture) -> None:
    line = ThrottledLine(log, "refused %(n)d from %(peer)s")
    with caplog.at_level(logging.WARNING):
        line.note(peer="100%d")
    assert [r.getMessage() for r in caplog.records] == ["refused 1 from 100%d"]


async def test_a_stopping_process_says_what_its_lines_hold_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    line = ThrottledLine(log, "lost %(n)d (%(total)d in all) on %(topic)s", now=clock)
    quiet = ThrottledLine(log, "never %(n)d", now=clock)
    with caplog.at_level(logging.WARNING):
        line.note(topic="a")
        line.note(4, topic="b")  # held back, its timer set
        say_held()  # the window has not ended: said all the same, the timer gone
        clock.t += 20.0
        await asyncio.sleep(0)
        say_held()  # nothing more to say
    # (say_held says the other lines of this process's tests too: only ours are read)
    assert [r.getMessage() for r in caplog.records if r.name == log.name] == [
        "lost 1 (1 in all) on a",
        "lost 4 (5 in all) on b",
    ]
    assert quiet.total == 0 and line._timer is None


def test_a_timer_left_on_a_closed_loop_does_not_stop_the_next_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A line outlives the loop its timer was set on (a process-wide line, tests, the
    CLI): the next burst gets a timer on the loop that runs then."""
    clock = Clock()
    line = ThrottledLine(log, "refused %(n)d", every_s=0.05, now=clock)

    async def burst() -> None:
        line.note()
        line.note(2)  # held back: a timer on this loop

    async def burst_and_wait() -> None:
        await burst()
        clock.t += 1.0
        await asyncio.sleep(0.2)  # this loop's timer says it

    with caplog.at_level(logging.WARNING):
        asyncio.run(burst())  # the loop closes before its timer fires
        clock.t += 1.0
        asyncio.run(burst_and_wait())
    said = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert said == ["refused 1", "refused 3", "refused 2"], said


async def test_a_line_said_at_the_window_end_carries_no_push_of_the_context_that_armed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It speaks for every occurrence the window held, so it names none of their pushes
    in its JSON fields (it carried the push_id of the first held one, while its text
    named the last)."""
    clock = Clock()
    fast_timers(monkeypatch)
    formatter = JsonFormatter("push-service")
    said: list[dict[str, Any]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(json.loads(formatter.format(record)))

    handler = Keep()
    log.addHandler(handler)
    try:
        line = ThrottledLine(log, "%(n)d failed, the last %(push)s", now=clock)
        with log_context(push_id="p1"):
            line.note(push="p1")  # said at once, as p1's
        with log_context(push_id="p2"):
            line.note(push="p2")  # held: arms the timer
        with log_context(push_id="p3"):
            line.note(push="p3")
        clock.t += 10
        await asyncio.sleep(0.05)
    finally:
        log.removeHandler(handler)
    assert [(s["message"], s.get("push_id")) for s in said] == [
        ("1 failed, the last p1", "p1"),
        ("2 failed, the last p3", None),
    ]
