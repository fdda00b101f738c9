"""The gateway's own counters for /metrics beyond the delivery counts: name -> (help,
value), read at each scrape."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.uids import REFUSED

if TYPE_CHECKING:
    from socket_gateway.app import Gateway
    from socket_gateway.resume import Resumer

__all__ = ["gateway_counts"]


def gateway_counts(gw: Gateway) -> dict[str, tuple[str, float]]:
    counts: dict[str, tuple[str, float]] = {
        "rejected_batches": (
            "Batches refused as malformed (content not one JSON value, ids or counts "
            "over their caps): nothing of them was written",
            gw.deliver_service.rejected,
        ),
    }
    counts["bus_consumer_restarts"] = (
        "Times the bus consumer died of an unexpected error and was restarted",
        gw.consumer_restarts,
    )
    counts["dedupe_evicted_early"] = (
        "Batch ids forgotten before their dedupe window ran out (its count or byte "
        "cap): a duplicate of one would be written again",
        gw.deliver_service.evicted_early,
    )
    if gw.token_check is not None:
        counts["unauthenticated_calls"] = (
            "gRPC calls refused for a missing or wrong IMROUTE_INTERNAL_TOKEN",
            gw.token_check.refused,
        )
    if gw.ws_endpoint is not None:
        counts.update(gw.ws_endpoint.refusals.metrics())
    counts["uids_refused"] = (
        "uids refused by the uid rule: a client token's sub (also counted in "
        "handshakes_refused_unauthorized)",
        REFUSED.total,
    )
    counts["metrics_heads_refused"] = (
        "Requests to the metrics port refused for a request head over a limit "
        "(IMROUTE_HTTP_MAX_HEAD_BYTES, _MAX_HEADERS: 431; _MAX_URL_BYTES: 414)",
        gw.metrics_refused.total,
    )
    if gw.resumer is not None:
        r = gw.resumer.stats
        counts["resumes"] = ("Connections that asked to resume (since=)", r.resumes)
        counts["resumes_incomplete"] = ("Resumes answered complete:false", r.incomplete)
        counts["replayed_pushes"] = ("Push frames written by replays", r.replayed)
        counts.update(resume_budget_counts(gw.resumer))
    if gw.follower is not None:
        seqs = gw.follower.sequencers.values()
        counts["batches_filled"] = (
            "Batches read from the recovery log because the bus had not brought them",
            sum(q.filled for q in seqs),
        )
        counts["batches_lost"] = (
            "Batches neither on the bus nor still in the recovery log: skipped",
            sum(q.lost for q in seqs),
        )
        counts["batches_late"] = (
            "Batches the bus brought after their turn (already delivered): dropped",
            sum(q.late for q in seqs),
        )
        counts["log_epochs"] = (
            "Topic recovery logs found started again under a new epoch (Redis lost them)",
            sum(q.epochs for q in seqs),
        )
        counts["batches_without_content"] = (
            "Bus batches whose content, stored once per push, was gone: dropped",
            gw.follower.without_content,
        )
    if gw.acks is not None:
        a = gw.acks.counts
        counts["acks"] = ("Client ack frames that acked pushes", a.acks)
        counts["acked_pushes"] = ("Pushes (per connection) those acks covered", a.acked)
        counts["bad_acks"] = (
            "Client ack frames ignored: malformed, unknown, ahead of what was sent, or "
            "already acked",
            a.bad,
        )
        counts["ack_flush_failures"] = (
            "Writes of acks to Redis that failed (kept for the next one)",
            a.failed_flushes,
        )
        counts["ack_updates_dropped"] = (
            "Ack and delivery updates dropped while Redis kept failing",
            a.dropped,
        )
    counts["unacked_forgotten"] = (
        "Pushes a connection was sent and never acked, past the 128 it is remembered "
        "for: still in the inbox, sent again on the next connect",
        gw.conns.unacked_forgotten,
    )
    return counts


def resume_budget_counts(resumer: Resumer) -> dict[str, tuple[str, float]]:
    """What one resume may read (`socket_gateway.resume_budget`): what it turned down,
    and the topic-log reads resumes made."""
    r, spans = resumer.stats, resumer.spans
    return {
        "resumes_rate_limited": (
            "Resumes whose position was not read, over IMROUTE_RECOVERY_RESUME_RATE_PER_UID "
            "for their user (the inbox only, complete:false)",
            r.limited.total,
        ),
        "resume_topics_over_budget": (
            "Topic logs a resume did not read: its position was over "
            "IMROUTE_RECOVERY_RESUME_MAX batches or _MAX_BYTES behind the head",
            r.over.total,
        ),
        "resume_moves_refused": (
            "Resumes whose position named another group that no gateway of it could have "
            "given out lately: nothing of that group read (complete:false)",
            r.moves_refused.total,
        ),
        "resume_topic_reads": (
            "Topic-log reads resumes made in Redis (ranges held in memory not counted)",
            spans.reads,
        ),
        "resume_topic_read_bytes": (
            "Bytes of topic-log entries those reads brought",
            spans.read_bytes,
        ),
        "move_tails_stopped": (
            "Moved connections whose old group's log grew past the read budget: not "
            "followed further",
            resumer.tails.stopped.total,
        ),
    }
