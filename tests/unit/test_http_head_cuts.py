"""The head deadline's count of the connections it closed, the head limits' count of
the heads they refused, and their throttled log lines."""

from __future__ import annotations

import logging

import pytest

from push_service.head_limits import HeadRefusals, ParseErrorLines
from push_service.http_server import LOG_EVERY_S, HeadCuts
from shared.http_heads import HeadLimits

LIMITS = HeadLimits()


def test_cuts_are_counted_and_logged_at_most_every_few_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    cuts = HeadCuts(2.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="push_service.http_server"):
        cuts.cut(began=True)  # the first is logged at once
        for _ in range(500):  # an attack: counted, not a line each
            cuts.cut(began=True)
        cuts.cut(began=False)  # the other kind: a line of its own
        now[0] += LOG_EVERY_S
        cuts.cut(began=True)  # the next line carries the count since the last
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "closed 1 connection(s) with a request head not whole after 2s (408; "
        "IMROUTE_HTTP_HEADER_TIMEOUT_S)",
        "closed 1 connection(s) that sent nothing in 2s (IMROUTE_HTTP_HEADER_TIMEOUT_S)",
        "closed 501 connection(s) with a request head not whole after 2s (408; "
        "IMROUTE_HTTP_HEADER_TIMEOUT_S)",
    ]
    assert (cuts.partial.total, cuts.silent.total) == (502, 1)


def test_heads_refused_and_uvicorns_parse_errors_are_logged_at_most_every_few_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    refusals = HeadRefusals(clock=lambda: now[0])
    lines = ParseErrorLines(clock=lambda: now[0])
    uvicorn_log = logging.getLogger("tests.uvicorn.error")
    uvicorn_log.addFilter(lines)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(300):  # an attack: counted, a line at once, then none
                refusals.refused(LIMITS.too_many_headers())
                uvicorn_log.warning(ParseErrorLines.MESSAGE)
            refusals.refused(LIMITS.url_too_long())  # another kind: a line of its own
            now[0] += 10
            refusals.refused(LIMITS.too_many_headers())
            uvicorn_log.warning(ParseErrorLines.MESSAGE)
            uvicorn_log.warning("something else")  # other lines pass as they are
    finally:
        uvicorn_log.removeFilter(lines)
    assert [r.getMessage() for r in caplog.records] == [
        "refused 1 request head(s) (431): the request has over 100 header fields "
        "(IMROUTE_HTTP_MAX_HEADERS)",
        "Invalid HTTP request received.",
        "refused 1 request head(s) (414): the request target (path and query) is over 8000 "
        "bytes (IMROUTE_HTTP_MAX_URL_BYTES)",
        "refused 300 request head(s) (431): the request has over 100 header fields "
        "(IMROUTE_HTTP_MAX_HEADERS)",
        "Invalid HTTP request received: 300 requests since the last line",
        "something else",
    ]
    assert refusals.counts == {"too_many_headers": 301, "uri_too_long": 1}
