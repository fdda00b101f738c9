"""The head deadline's count of the connections it closed, and its throttled log line."""

from __future__ import annotations

import logging

import pytest

from push_service.http_server import LOG_EVERY_S, HeadCuts


def test_cuts_are_counted_and_logged_at_most_every_few_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    cuts = HeadCuts(2.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="push_service.http_server"):
        cuts.cut(began=True)  # the first is logged at once
        for _ in range(500):  # an attack: counted, not a line each
            cuts.cut(began=True)
        cuts.cut(began=False)
        now[0] += LOG_EVERY_S
        cuts.cut(began=False)  # the next line carries the count since the last
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "closed 1 connection(s) with a request head not whole after 2s (408) and 0 that "
        "sent nothing (IMROUTE_HTTP_HEADER_TIMEOUT_S)",
        "closed 500 connection(s) with a request head not whole after 2s (408) and 2 that "
        "sent nothing (IMROUTE_HTTP_HEADER_TIMEOUT_S)",
    ]
    assert (cuts.partial, cuts.silent) == (501, 2)
