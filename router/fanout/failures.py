"""A batch that failed is counted and listed, and the push goes on with the next one.

Its publish was retried already, by the bus (`router.bus.hedged`). Only a bus that stays
down ends the push: after MAX_CONSECUTIVE_FAILURES failed batches in a row, the last
error is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from router.fanout.publisher import BatchPublisher
from router.jobs.base import MAX_FAILED_LISTED, FailedBatch
from shared.errors import ImrouteError
from shared.proto import gateway_pb2

__all__ = ["MAX_CONSECUTIVE_FAILURES", "publish_or_count"]

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 10


async def publish_or_count(
    publisher: BatchPublisher,
    mode: gateway_pb2.Mode.ValueType,
    topic: str,
    uids: Sequence[str] = (),
    *,
    group_id: str = "",
    everyone: bool = False,
    after: str | None = None,
) -> bool:
    """Publish one batch; if it fails, count it (once) and list it. Whether it went.

    `after` names a broadcast page (the uid it starts after) in the job's failed list.
    """
    counters = publisher.counters
    failed_before = counters.failed_batches
    try:
        await publisher.publish(mode, topic, uids, group_id=group_id, everyone=everyone)
    except ImrouteError as exc:
        if counters.failed_batches == failed_before:
            # It failed before reaching the bus (the recovery log): still a lost batch.
            counters.batches += 1
            counters.failed_batches += 1
        if len(counters.failed) < MAX_FAILED_LISTED:
            counters.failed.append(FailedBatch(topic, len(uids), after, str(exc)))
        counters.consecutive_failures += 1
        log.warning(
            "a batch of %d uids to %s (after %r) failed (%d failed in this push): %s",
            len(uids),
            topic,
            after,
            counters.failed_batches,
            exc,
        )
        if counters.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
            raise
        return False
    counters.consecutive_failures = 0
    return True
