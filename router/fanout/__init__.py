"""Broadcast and multicast: batches of up to 1000 uids, published once per topic.

- `publisher`: builds a Batch, encodes it once, hands it to the bus, counts it.
- `broadcast`: one batch per directory page, to every gateway.
- `batcher`: the pure GroupBatcher (a group's batch leaves at 1000 users or when its
  oldest entry waited the flush timeout).
- `multicast`: resolves recipients' groups and feeds the batcher.
- `runner`: runs either as a background job with a status and a lease.
"""

from router.fanout.batcher import FlushReason, GroupBatcher, ReadyBatch
from router.fanout.broadcast import run_broadcast
from router.fanout.multicast import chunked, run_multicast
from router.fanout.publisher import BROADCAST_TOPIC, BatchPublisher, Publisher, PushCounters
from router.fanout.runner import JobRunner

__all__ = [
    "BROADCAST_TOPIC",
    "BatchPublisher",
    "FlushReason",
    "GroupBatcher",
    "JobRunner",
    "Publisher",
    "PushCounters",
    "ReadyBatch",
    "chunked",
    "run_broadcast",
    "run_multicast",
]
