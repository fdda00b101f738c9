"""The gateway's delivery core: one batch to the local sockets it names, at most once.

Both ways in call it: the gRPC servicer (P2P, `grpc_server`) and the bus consumer
(broadcast and multicast, `bus_consumer`).
"""

from __future__ import annotations

from shared.batches import message_of
from shared.clock import Clock
from shared.proto import gateway_pb2
from shared.wire import push_prefix
from socket_gateway.connections import LocalConnections
from socket_gateway.dedup import RecentIds, RecentReplies

__all__ = ["DeliverService"]


class DeliverService:
    """Writes batches to local connections; counts what happened for tests and metrics."""

    def __init__(self, conns: LocalConnections, clock: Clock, recent: RecentIds) -> None:
        self._conns = conns
        self._clock = clock
        self._recent = recent
        self._replies = RecentReplies(clock)
        self.calls = 0  # gRPC calls (Deliver or DeliverMany), counted by the servicer
        self.batches = 0
        self.duplicates = 0
        self.expired = 0

    def deliver(self, batch: gateway_pb2.Batch, log: str = "") -> gateway_pb2.DeliverReply:
        """Deliver one batch (from a gRPC call or the bus), at most once per batch_id.
        `log`: the recovery log it is from (`b`, `g`, `o`); by default, as its mode says."""
        self.batches += 1
        if batch.batch_id and batch.mode == gateway_pb2.MODE_P2P:
            first = self._replies.get(batch.batch_id, batch.uids)
            if first is not None:
                # A retried call whose first answer was lost: answer as the first attempt
                # did (even if the push has expired since: it was delivered in time).
                self.duplicates += 1
                return gateway_pb2.DeliverReply(
                    delivered=first[0], missing=first[1], duplicate=True
                )
        if batch.batch_id and self._recent.check_and_add(batch.batch_id):
            # Before the expiry check: a batch delivered in time is a duplicate, not late.
            self.duplicates += 1
            return gateway_pb2.DeliverReply(duplicate=True)
        if batch.expires_ms and self._clock.now_ms() > batch.expires_ms:
            # Never late: an expired message is dropped here and counted.
            self.expired += 1
            return gateway_pb2.DeliverReply(expired=True)
        # Encoded once per batch, whatever the number of recipients; each connection
        # adds its own position.
        prefix = push_prefix(message_of(batch))
        if batch.mode == gateway_pb2.MODE_P2P:
            delivered, missing = self._conns.deliver_p2p(batch.uids, batch.seqs, prefix)
            if batch.batch_id:
                self._replies.put(batch.batch_id, batch.uids, delivered)
            return gateway_pb2.DeliverReply(delivered=delivered, missing=missing)
        log = log or ("b" if batch.mode == gateway_pb2.MODE_BROADCAST else "g")
        if batch.everyone:
            count = self._conns.deliver_all(prefix, log, batch.seq)
            return gateway_pb2.DeliverReply(connections=count)
        delivered, missing = self._conns.deliver(batch.uids, prefix, log, batch.seq)
        return gateway_pb2.DeliverReply(delivered=delivered, missing=missing)
