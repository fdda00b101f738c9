"""Broadcast and multicast: batches of up to 1000 uids, published once per topic.

- `publisher`: builds a Batch under its stable id, encodes it once, hands it to the bus
  (which retries the publish), counts it.
- `broadcast`: one batch per directory page, to every gateway.
- `batcher`: the pure GroupBatcher (a group's batch leaves at 1000 users or when its
  oldest entry waited the flush timeout).
- `multicast`: resolves recipients' groups and feeds the batcher.
- `failures`: a failed batch is counted and listed, and the push goes on.
- `runner`: runs either as a background job with a status, a lease and (broadcasts)
  checkpoints another process can resume from.
"""

# No re-exports: importing one module of the package loads only what it needs.
