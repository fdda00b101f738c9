"""What the Redis Streams bus logs of its trims (router.bus.redis_trim.TrimReporter):
a burst of losses that stops is said whole at the end of its line's window, not only
when the gateway next loses entries (the operator's trial: "1 entries" logged while 787
were counted)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from router.bus.redis_trim import TrimReport, TrimReporter


async def test_a_burst_of_losses_is_said_whole(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    reporter = TrimReporter(maxlen=50, group_idle_s=600)
    waits: list[float] = []
    real = loop.call_later

    def soon(delay: float, callback: object, *args: object) -> asyncio.TimerHandle:
        waits.append(delay)
        return real(0.01, callback, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_later", soon)
    with caplog.at_level(logging.WARNING):
        now = loop.time() - 10.5  # the window the timer waits out has passed by its call
        reporter.report("broadcast", TrimReport("1-0", lost={"gw1": 1}), now)
        for i in range(1, 787):
            reporter.report("broadcast", TrimReport(f"{i}-1", lost={"gw1": 1}), now + 0.001)
        assert len(caplog.records) == 1 and len(waits) == 1  # one line, one timer
        assert 9.9 < waits[0] <= 10.0
        await asyncio.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records]
    assert "1 entries it had not read were trimmed (1 in all" in lines[0], lines
    assert "786 entries it had not read were trimmed (787 in all" in lines[1], lines
    assert reporter.losses.unread_trimmed == {("broadcast", "gw1"): 787}
