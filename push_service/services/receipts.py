"""Receipts as the HTTP API shows them: a push's counts (any mode) and its recipients
by state (listable pushes only)."""

from __future__ import annotations

from typing import Any

from push_service.errors import Conflict, NotFound
from router.jobs.base import Job, JobStatus
from router.receipts.base import Counts, ReceiptReads, unwritten
from shared.clock import Clock

__all__ = ["MAX_PAGE", "SETTLE_MS", "ReceiptsView"]

MAX_PAGE = 1000
# A store:false push's unreached read expired this long after its job ended: by then the
# gateways have written its last batches (a gateway further behind on the bus still
# counts as it writes them: expired -> delivered).
SETTLE_MS = 10_000

_ZERO = Counts("", 0, 0, 0, 0, 0, 0, False)


class ReceiptsView:
    def __init__(
        self, reads: ReceiptReads | None, clock: Clock, recovery_window_s: float = 300.0
    ) -> None:
        """`recovery_window_s`: IMROUTE_RECOVERY_WINDOW_S, how long a broadcast's or
        multicast's batches can be read by a resuming client (`_past_recovery`)."""
        self._reads = reads
        self._clock = clock
        self._window_ms = int(recovery_window_s * 1000)

    async def counts(self, push_id: str) -> Counts | None:
        return None if self._reads is None else await self._reads.counts(push_id)

    async def status(self, push_id: str, job: Job | None) -> dict[str, Any]:
        """A job's record with its receipt's counts, or a P2P push's receipt (a job's
        too, once its record lapsed)."""
        counts = await self.counts(push_id)
        if job is not None:
            answer = job.as_dict()
            c = counts or _ZERO
            answer.update(
                delivered=c.delivered,
                acked=c.acked,
                queued=c.queued,
                expired=c.expired,
                listable=c.listable,
            )
            if counts is not None and counts.recipients > answer["recipients"]:
                answer["recipients"] = counts.recipients
            # Counts-only estimates stay within the recipients. A broadcast to everyone
            # online counts none up front (its job's `recipients` stays 0, as it always
            # has): its estimates stand as they are.
            if answer["recipients"]:
                for name in ("delivered", "acked"):
                    answer[name] = min(answer[name], answer["recipients"])
            if counts is not None and not c.listable:  # of the job's recipients
                answer["queued"] = unwritten(
                    answer["recipients"], answer["delivered"], answer["expired"]
                )
                if not c.kept and self._settled(job):
                    _never_written(answer)
            if counts is not None and c.kept and self._past_recovery(job):
                _never_written(answer)
            return _reached(answer)
        if counts is None:
            raise NotFound(f"no push {push_id!r} (or its receipt expired: IMROUTE_RECEIPTS_TTL_S)")
        answer = _reached(
            {
                "push_id": push_id,
                "mode": counts.mode,
                "status": "done",
                "recipients": counts.recipients,
                "online": counts.online,
                "offline": counts.recipients - counts.online,
                "delivered": counts.delivered,
                "acked": counts.acked,
                "queued": counts.queued,
                "expired": counts.expired,
                "listable": counts.listable,
            }
        )
        if not counts.kept:  # its job's record lapsed: the job ended long ago
            _never_written(answer)
        return answer

    def _settled(self, job: Job, after_ms: int = 0) -> bool:
        """The job ended SETTLE_MS (and `after_ms`) ago or more."""
        ended = job.finished_at
        if job.status not in (JobStatus.DONE, JobStatus.FAILED) or ended is None:
            return False
        return self._clock.now_ms() - ended >= SETTLE_MS + after_ms

    def _past_recovery(self, job: Job | None) -> bool:
        """A stored broadcast's or multicast's recipients not written by now never will
        be: offline when it went, they get it only by resuming with a position from
        before it, within IMROUTE_RECOVERY_WINDOW_S of its batches (a fresh connection
        reads the user's inbox, which holds P2P pushes only). So from the end of that
        window after its job ended, its `queued` count as `expired`. Without its job's
        record (None) the end is not known (Redis may have lost the record early): the
        receipt's counts stand as they are."""
        return job is not None and self._settled(job, self._window_ms)

    async def recipients(
        self, push_id: str, state: str, cursor: str | None, limit: int, job: Job | None = None
    ) -> dict[str, Any]:
        """`job`: a multicast's record, if it is left (`_past_recovery`)."""
        counts = await self.counts(push_id)
        if counts is None or self._reads is None:
            raise NotFound(f"no receipt for push {push_id!r}")
        if not counts.listable:
            raise Conflict(
                f"push {push_id!r} {_counted_only(counts)}: its receipt keeps counts only"
            )
        if state == "queued" and counts.mode != "p2p" and self._past_recovery(job):
            return {"push_id": push_id, "state": state, "uids": [], "cursor": None}
        page = await self._reads.page(push_id, state, cursor, limit)
        return {"push_id": push_id, "state": state, "uids": page.uids, "cursor": page.cursor}


def _counted_only(counts: Counts) -> str:
    """Why a receipt keeps no list of its recipients, as far as it can tell."""
    if counts.mode == "broadcast":
        return "is a broadcast (its recipients are the directory's users, not a list)"
    if counts.mode == "multicast":
        return (
            f"is a multicast to a directory audience (tags_any), or to more uids than "
            f"IMROUTE_RECEIPTS_MAX_RECIPIENTS ({counts.recipients} recipients)"
        )
    return f"has {counts.recipients} recipients, more than IMROUTE_RECEIPTS_MAX_RECIPIENTS"


def _never_written(answer: dict[str, Any]) -> None:
    """A `store:false` push whose job ended SETTLE_MS ago, counts only: whom it did not
    write to a connection it never will (nothing keeps the message), so its queued are
    expired, as a listable receipt marks them when their chunk is resolved."""
    answer["expired"] += answer["queued"]
    answer["queued"] = 0


def _reached(answer: dict[str, Any]) -> dict[str, Any]:
    """`answer`, a broadcast's `online` being the recipients it reached and `offline` the
    rest: a broadcast looks no route up (every gateway takes every page, and writes to
    whom it holds), so who was online is known only by who was written it."""
    if answer["mode"] == "broadcast":
        answer["online"] = answer["delivered"]
        answer["offline"] = max(0, answer["recipients"] - answer["delivered"])
    return answer
