"""What one resume may read: where a read starts, how far behind the head it is, and
which positions in another group are read as a move."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.positions import counter_of, seq_of
from shared.settings import Settings
from socket_gateway.resume_budget import ResumeLimits, credible_move, start_of

E1, E2 = 1_790_000_000_000, 1_790_000_500_000  # two epochs of one log (Redis lost it)
LIMITS = ResumeLimits(max_entries=100, max_bytes=10_000)


def behind(after: int, head: int) -> int:
    """How many batches a resume from `after` reads to reach `head`."""
    return counter_of(head) - counter_of(start_of(after, head))


def test_a_read_starts_at_the_position_in_its_epoch_else_at_the_logs_start() -> None:
    head = seq_of(E1, 500)
    assert start_of(seq_of(E1, 450), head) == seq_of(E1, 450)
    assert start_of(0, head) == seq_of(E1, 0)  # nothing yet: the whole log
    assert start_of(seq_of(0, 7), head) == seq_of(E1, 0)  # before epochs: likewise
    assert start_of(seq_of(E2, 3), seq_of(E2, 9)) == seq_of(E2, 3)
    assert start_of(seq_of(E1, 450), seq_of(E2, 9)) == seq_of(E2, 0)  # the log restarted


def test_a_position_at_or_past_the_head_reads_nothing() -> None:
    head = seq_of(E1, 500)
    assert start_of(head, head) == head and behind(head, head) == 0
    assert behind(seq_of(E1, 501), head) == 0  # a number the log never reached
    assert behind(seq_of(E2, 1), head) == 0  # a later epoch than the log's
    assert behind(0, 0) == 0 and behind(seq_of(E1, 5), 0) == 0  # no log


def test_behind_counts_the_batches_to_the_head() -> None:
    head = seq_of(E1, 500)
    assert behind(seq_of(E1, 400), head) == 100
    assert behind(0, head) == 500
    assert behind(seq_of(E1, 400), seq_of(E2, 30)) == 30  # the new log, from its start


def test_a_move_is_read_only_from_a_place_a_gateway_of_that_group_gave_out_lately() -> None:
    head = seq_of(E1, 500)
    assert credible_move(seq_of(E1, 400), head, LIMITS)  # 100 behind: within the budget
    assert credible_move(head, head, LIMITS)  # at the head: nothing to read, followed
    assert not credible_move(seq_of(E1, 399), head, LIMITS)  # too far behind
    assert not credible_move(seq_of(E1, 501), head, LIMITS)  # past the head
    assert not credible_move(seq_of(E2, 400), head, LIMITS)  # another epoch
    assert not credible_move(0, head, LIMITS)  # "nothing yet" in a log that has batches
    assert not credible_move(seq_of(E1, 3), 0, LIMITS)  # a group whose log is empty
    assert credible_move(0, 0, LIMITS)  # a group with no batch yet: followed, nothing read


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ResumeLimits(max_entries=0)
    with pytest.raises(ValueError, match="at least 1"):
        ResumeLimits(burst_per_uid=0)


def test_a_byte_budget_too_small_is_refused() -> None:
    # What the limits read from the settings: tests/unit/test_settings_limits.py.
    with pytest.raises(ConfigError, match="IMROUTE_RECOVERY_RESUME_MAX_BYTES"):
        Settings.load({"IMROUTE_RECOVERY_RESUME_MAX_BYTES": "10"})
