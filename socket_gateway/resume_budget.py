"""What one resume may read, sans I/O: the budget per topic log, the rule for a position
in another group, and the per-user rate of resumes.

A position is the client's word: any client with a valid token can name an old place
in a topic log (or another group's log), and each resume used to read the log from
there to its head, whole topic logs for a 400-byte handshake. Now each topic log is
read only within a budget measured from its head (batches: decided from the heads,
before anything is read; bytes: while reading, `RecoveryReads.read_span`), a position
in another group is read as a move only where a gateway of that group could have given
it out, and a user's resumes on a gateway are rate-limited. Whatever is not read makes
the resume `complete: false`, which every client already handles (it resyncs from its
own store). docs/operations/security-review.md, "What one resume may read", says why these rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.positions import epoch_of, seq_of

if TYPE_CHECKING:
    from shared.settings import GatewaySettings

__all__ = ["ResumeLimits", "credible_move", "start_of"]


@dataclass(frozen=True, slots=True)
class ResumeLimits:
    max_entries: int = 1000  # IMROUTE_RECOVERY_RESUME_MAX: batches behind a log's head
    max_bytes: int = 1 << 20  # IMROUTE_RECOVERY_RESUME_MAX_BYTES: of a log's entries
    rate_per_uid: float = 0.5  # IMROUTE_RECOVERY_RESUME_RATE_PER_UID (0: no limit)
    burst_per_uid: int = 20  # IMROUTE_RECOVERY_RESUME_BURST_PER_UID

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1 or self.burst_per_uid < 1:
            raise ValueError(f"resume limits must be at least 1: {self}")
        if self.rate_per_uid < 0:
            raise ValueError(f"a rate of resumes cannot be negative: {self}")

    @classmethod
    def from_settings(cls, s: GatewaySettings) -> ResumeLimits:
        return cls(
            s.recovery_resume_max,
            s.recovery_resume_max_bytes,
            s.recovery_resume_rate_per_uid,
            s.recovery_resume_burst_per_uid,
        )


def start_of(after: int, head: int) -> int:
    """Where a read of the log whose head is `head` starts for a position at `after`:
    `after` in the log's epoch; the log's start for 0 (nothing yet) or a position of an
    earlier epoch (a log Redis lost and started again). A position past the head (a later
    epoch, or a number the log never reached) has nothing to read: the head."""
    if after >= head:
        return head
    if after and epoch_of(after) == epoch_of(head):
        return after
    return seq_of(epoch_of(head), 0)


def credible_move(g: int, head: int, limits: ResumeLimits) -> bool:
    """Whether a position at `g` in another group's log (whose head is `head`) is read as
    a move from that group: it must name a batch the log holds now, within the budget
    behind its head, as a gateway of that group gives out (its `pos` carries the group's
    head as it delivers); 0 only while the log is still empty (a group that had no batch
    yet, or one no gateway uses: nothing to read, and none missed but what its tail
    brings; no span is kept for an empty log, so a made-up group name costs a few reads
    of an empty key, rate-limited per user). Any other place (0 in a log that has
    batches, another epoch, past the head, far behind it) could come from no gateway of
    that group lately: nothing of the group is read, and the resume is incomplete."""
    if not g:
        return not head
    if not head or epoch_of(g) != epoch_of(head) or g > head:
        return False
    return head - g <= limits.max_entries
