"""What one resume may read, a mixin of `shared.settings.Settings` (read as `IMROUTE_*`
like any other field). README, "Recovery: positions, `since`, the inbox"; why:
docs/security.md, "What one resume may read"."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

__all__ = ["ResumeSettings"]


class ResumeSettings(BaseSettings):
    # per topic log (broadcast, offline, a group's): how far behind the log's head a
    # resume's position may stand, in batches, and how many bytes of log entries it may
    # read; past either it reads nothing of that log and answers complete:false. The
    # bytes are about what a gateway keeps of a topic in memory (64 batches of 1000
    # uids), the batches half of IMROUTE_RECOVERY_TOPIC_MAX's default
    recovery_resume_max: int = Field(1000, ge=1, le=1_000_000)
    recovery_resume_max_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)
    # resumes (connects with `since`) per user on one gateway: a token bucket of
    # _BURST, refilled at _RATE per second; past it the position is not read (the
    # connection gets its inbox and complete:false). Rate 0: no limit. One every 2 s
    # keeps a phone on a flapping network whole; each resume's read is bounded anyway
    recovery_resume_rate_per_uid: float = Field(0.5, ge=0, le=1_000_000)
    recovery_resume_burst_per_uid: int = Field(20, ge=1, le=1_000_000)
