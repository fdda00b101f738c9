"""The client limits' pure rules (socket_gateway/ws/ratelimit.py), on an injected clock."""

from __future__ import annotations

import pytest

from shared.settings import Settings
from shared.throttled import Throttled
from socket_gateway.ws.ratelimit import FrameRate

LIMIT = FrameRate(rate=20, burst=50)


def drain(limit: FrameRate, tat: float, now: float, frames: int) -> tuple[int, float]:
    """Frames admitted one at a time at `now` until one is refused; and the state."""
    admitted = 0
    while admitted < frames:
        after = limit.admit(tat, now, 1)
        if after is None:
            break
        tat, admitted = after, admitted + 1
    return admitted, tat


def test_a_new_connection_has_a_full_burst_then_nothing() -> None:
    admitted, tat = drain(LIMIT, 0.0, 100.0, 1000)
    assert admitted == 50
    assert LIMIT.admit(tat, 100.0) is None


def test_the_bucket_refills_at_the_rate() -> None:
    _, tat = drain(LIMIT, 0.0, 100.0, 50)
    assert LIMIT.admit(tat, 100.04) is None  # 0.8 of a token back
    admitted, tat = drain(LIMIT, tat, 100.5, 1000)
    assert admitted == 10  # 0.5 s at 20/s
    admitted, _ = drain(LIMIT, tat, 1000.0, 1000)
    assert admitted == 50  # idle for long: full again, never more than the burst


def test_a_steady_client_at_the_rate_is_never_refused() -> None:
    tat, now = 0.0, 5.0
    for _ in range(10_000):  # 500 s at exactly 20 frames/s
        after = LIMIT.admit(tat, now)
        assert after is not None
        tat, now = after, now + 0.05


def test_frames_arriving_together_count_together() -> None:
    after = LIMIT.admit(0.0, 10.0, 50)
    assert after is not None
    assert LIMIT.admit(0.0, 10.0, 51) is None
    # A refused batch leaves the state as it was: the caller closes the connection.
    assert LIMIT.admit(after, 10.0, 1) is None
    assert LIMIT.admit(after, 10.1, 2) is not None


def test_a_burst_of_one_allows_the_rate_only() -> None:
    slow = FrameRate(rate=2, burst=1)
    tat = slow.admit(0.0, 1.0)
    assert tat is not None
    assert slow.admit(tat, 1.4) is None
    assert slow.admit(tat, 1.5) is not None


@pytest.mark.parametrize(("rate", "burst"), [(0, 10), (-1, 10), (5, 0)])
def test_a_meaningless_limit_is_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="rate > 0"):
        FrameRate(rate, burst)


def test_log_lines_are_throttled_and_report_what_they_skipped() -> None:
    t = Throttled(every_s=10)
    assert t.note(0.0) == 1  # the first one is logged at once
    assert [t.note(now) for now in (1.0, 2.0, 9.9)] == [0, 0, 0]
    assert t.note(10.0) == 4  # this one and the three that were not logged
    assert t.note(10.5) == 0
    assert t.total == 6


def test_the_defaults() -> None:
    s = Settings.load({})
    assert (s.max_connections_per_user, s.ws_client_frame_rate) == (10, 20.0)
    assert s.ws_client_frame_burst == 50


def test_what_a_line_held_back_is_due_at_the_end_of_its_window() -> None:
    t = Throttled(every_s=10)
    assert t.due_in(0.0) is None  # nothing held back
    assert t.note(0.0, 1) == 1
    assert t.note(1.0, 786) == 0
    assert t.due_in(4.0) == 6.0 and t.flush(4.0) == 0  # not yet
    assert t.flush(10.0) == 786 and t.due_in(10.0) is None
    assert t.note(11.0) == 0  # within the flushed line's window
    assert t.total == 788
