"""What the Redis Streams bus logs of its trims (router.bus.redis_trim.TrimReporter):
each live gateway's losses on a line of its own, throttled, with the total; a burst
said whole is `ThrottledLine`'s (tests/unit/test_throttled_line.py)."""

from __future__ import annotations

import logging

import pytest

from router.bus.redis_trim import TrimReport, TrimReporter


def test_each_gateway_s_losses_are_a_line_of_their_own_with_the_total(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reporter = TrimReporter(maxlen=50, group_idle_s=600)
    with caplog.at_level(logging.WARNING):
        reporter.report("broadcast", TrimReport("1-0", lost={"gw1": 3, "gw2": 1}))
        reporter.report("broadcast", TrimReport("2-0", lost={"gw1": 4}))  # held back
        reporter.report("broadcast", TrimReport("3-0", dropped=("gw9",)))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "bus broadcast: gateway gw1 fell more than IMROUTE_BUS_MAXLEN (50) entries behind; "
        "3 entries it had not read were trimmed (3 in all; imroute_bus_unread_trimmed_total)",
        "bus broadcast: gateway gw2 fell more than IMROUTE_BUS_MAXLEN (50) entries behind; "
        "1 entries it had not read were trimmed (1 in all; imroute_bus_unread_trimmed_total)",
        "bus broadcast: deleted the consumer groups of gw9, which read nothing for 600s "
        "(IMROUTE_BUS_GROUP_IDLE_S): gateways that left",
    ]
    assert reporter.losses.unread_trimmed == {("broadcast", "gw1"): 7, ("broadcast", "gw2"): 1}
