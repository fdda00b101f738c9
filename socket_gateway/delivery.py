"""The gateway's delivery core: one batch to the local sockets it names, at most once.

Every way in calls it: the delivery calls of P2P (`deliver_call`, on the delivery link,
`link_server`, or in a gRPC DeliverMany, `grpc_server`) and the bus consumer
(broadcast and multicast, `bus_consumer`).

What it accepts in a batch (`BatchCheck`), whoever sent it (a router, the bus, a
stranger who got past the token), is checked before anything is written to a client.
The push frame is built by copying `content_json` between the frame's own keys
(shared/wire.py), so content that is not exactly one JSON value could close the value
and add keys: `null,"type":"reconnect"` would turn a push into a reconnect order. Ids
and counts are capped because they are kept (the dedupe sets) or looped over.

At most once: a bus redelivery, a hedged duplicate or a retried gRPC call of a batch the
gateway already wrote must not reach clients twice. The gateway keeps bounded,
time-windowed memories of recently delivered batches, one per way in (`RecentIds`,
`RecentReplies`). Bus batches and P2P batches are remembered apart, so a burst of one
cannot push the other's ids out early: at 5k P2P batches/s a shared set of 200k ids
covered 40 s instead of 10 minutes, and a bus redelivery after that reached a client
twice. Each memory is bounded in count and in bytes; an id forgotten before its window
ran out is counted (`evicted_early`), since a duplicate of it would get through.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import ClassVar

import orjson

from router.receipts.base import DELIVERED
from router.stats.latency import LatencyHistogram
from shared.batches import message_of
from shared.clock import Clock
from shared.expiring import ExpiringMap
from shared.positions import seq_of
from shared.proto import gateway_pb2
from shared.throttled import ThrottledLine
from shared.tracing import sampled
from shared.wire import push_prefix
from socket_gateway.connections import LocalConnections
from socket_gateway.tracing import GatewayTracing

__all__ = [
    "MAX_BATCH_UIDS",
    "MAX_CONTENT_BYTES",
    "MAX_ID_CHARS",
    "MAX_NAME_CHARS",
    "BadCall",
    "BatchCheck",
    "DeliverService",
    "LinkCounts",
    "RecentIds",
    "RecentReplies",
]

log = logging.getLogger(__name__)
_log = log  # what `deliver` calls it: its parameter `log` (a recovery log) hides this one

# Bad batches may come in floods: one log line per this many seconds at most.
LOG_EVERY_S = 10.0
# A P2P batch expired on arrival though its call had this long left: a clock skew.
SKEW_HINT_S = 0.5

# What the push service itself accepts (push_service/schemas.py), with room to spare.
MAX_CONTENT_BYTES = 64 * 1024
MAX_ID_CHARS = 128  # batch_id, msg_id, push_id
MAX_NAME_CHARS = 128  # a uid, the sender, the group
MAX_BATCH_UIDS = 10_000  # IMROUTE_BATCH_SIZE's upper bound
# Bus batches of one push share their content: parse it once per message.
_CHECKED = 256


def _no_constant(name: str) -> object:
    # NaN and Infinity are Python's JSON extensions; JavaScript's JSON.parse refuses them.
    raise ValueError(f"{name} is not JSON")


class BatchCheck:
    """`problem(batch)`: None for a batch fit to write, else what is wrong with it."""

    def __init__(self) -> None:
        self._checked: OrderedDict[str, bytes] = OrderedDict()

    def problem(self, batch: gateway_pb2.Batch) -> str | None:
        if len(batch.batch_id) > MAX_ID_CHARS:
            return f"batch_id over {MAX_ID_CHARS} characters"
        m = batch.message
        if not m.msg_id or len(m.msg_id) > MAX_ID_CHARS or len(m.push_id) > MAX_ID_CHARS:
            return f"msg_id and push_id must be 1-{MAX_ID_CHARS} characters"
        if len(getattr(m, "from")) > MAX_NAME_CHARS or len(batch.group_id) > MAX_NAME_CHARS:
            return f"from and group_id must be at most {MAX_NAME_CHARS} characters"
        uids = batch.uids
        if len(uids) > MAX_BATCH_UIDS:
            return f"{len(uids)} uids; at most {MAX_BATCH_UIDS} per batch"
        if any(len(uid) > MAX_NAME_CHARS for uid in uids):
            return f"a uid over {MAX_NAME_CHARS} characters"
        if batch.seqs and len(batch.seqs) != len(uids):
            return "seqs must be empty or one per uid"
        if batch.epochs and len(batch.epochs) != len(batch.seqs):
            return "epochs must be empty or one per seq"
        if batch.everyone and uids:
            return "an everyone batch names no uids"
        return self._content_problem(m.msg_id, m.content_json)

    def _content_problem(self, msg_id: str, content: bytes) -> str | None:
        checked = self._checked
        if checked.get(msg_id) == content:
            checked.move_to_end(msg_id)
            return None
        if len(content) > MAX_CONTENT_BYTES:
            return f"content_json is {len(content)} bytes; the limit is {MAX_CONTENT_BYTES}"
        try:
            # Strict UTF-8 and exactly one JSON value, no NaN: orjson checks all of it,
            # about 10 times faster than json.
            orjson.loads(content)
        except orjson.JSONDecodeError:
            try:
                # What orjson refuses json may take (an escaped lone surrogate); json
                # also names the problem. Strict UTF-8 first (json.loads would also take
                # UTF-16 bytes, which a text frame cannot carry).
                json.loads(content.decode("utf-8"), parse_constant=_no_constant)
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                return f"content_json is not one JSON value: {_short(exc)}"
        checked[msg_id] = content
        if len(checked) > _CHECKED:
            checked.popitem(last=False)
        return None


def _short(exc: Exception) -> str:
    text = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
    return text[:120]


class BadCall(Exception):
    """A delivery call refused whole: what is wrong with its first bad batch."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class LinkCounts:
    """The delivery link's (socket_gateway.link_server)."""

    __slots__ = ("bad", "calls", "open", "opened", "refused")

    def __init__(self) -> None:
        self.calls = 0  # StreamCalls answered on links
        self.opened = 0
        self.open = 0
        self.refused = 0  # connections that never got in (no, bad or late hello)
        self.bad = 0  # open links closed for a frame too big or not a StreamCall


# The dedupe memories: what makes delivery at most once, one per way in.

# What an entry costs besides its id and bitmap: the tuple, the dict slot (roughly).
ENTRY_OVERHEAD = 200
# How long past its expiry a P2P batch's answer is kept: a retry of it may still be on
# its way, and must get the first answer (delivered), not "expired".
REPLY_GRACE_S = 5.0


class _Memory:
    """Batch ids, each with a few bytes (an answer's bitmap, or none), kept for
    `window_s` at most (the class's WINDOW_S unless given), within `max_entries` and
    about `max_bytes`."""

    WINDOW_S: ClassVar[float]

    def __init__(
        self,
        clock: Clock,
        window_s: float | None = None,
        max_entries: int = 200_000,
        max_bytes: int = 64 << 20,
    ) -> None:
        self._window = self.WINDOW_S if window_s is None else window_s
        self._kept: ExpiringMap[str, bytes] = ExpiringMap(
            clock.monotonic, _entry_size, max_entries, max_bytes
        )

    @property
    def evicted_early(self) -> int:
        """Entries forgotten before their time was up, for the caps."""
        return self._kept.evicted_early

    @property
    def bytes(self) -> int:
        return self._kept.bytes

    def __len__(self) -> int:
        return len(self._kept)


def _entry_size(batch_id: str, kept: bytes) -> int:
    return len(batch_id) + len(kept) + ENTRY_OVERHEAD


class RecentIds(_Memory):
    """Bus batch ids seen within `window_s` (the bus's redelivery horizon: Pub/Sub's
    longest ack deadline is 600 s), at most `max_entries` and about `max_bytes`."""

    # Kept for the same window each, so insertion order is expiry order.
    WINDOW_S = 600.0

    def check_and_add(self, batch_id: str) -> bool:
        """True if `batch_id` was seen within the window; records it either way."""
        return self._kept.add(batch_id, b"", self._window)


class RecentReplies(_Memory):
    """What recent P2P batches delivered, by batch id: the P2P dedupe, and the answer
    to a retried call.

    A router that lost the answer to a delivery call resends the same batch; the gateway
    drops it as a duplicate and answers with what the first attempt delivered, so the
    push is reported delivered once, not offline or failed. A retry resends the same
    uids in the same order, so a bitmap of the delivered positions is enough (125 bytes
    per 1000 uids; empty when every uid was delivered).

    Every P2P batch expires by the end of the router's call (its `expires_ms`), and an
    expired batch is never written, so an entry is needed only until then, plus
    REPLY_GRACE_S for a retry still in flight: at 10k batches/s and the default 2 s
    deadline that is about 70k entries, well inside the caps. A batch without an expiry
    (`expires_ms` 0, which the wire allows: a hand-made call) is kept for `window_s`.
    """

    # batch id -> delivered bitmap; roughly in expiry order (expiries follow the calls)
    WINDOW_S = 60.0

    def put(
        self,
        batch_id: str,
        uids: Sequence[str],
        delivered: Sequence[str],
        expires_in_s: float | None = None,
    ) -> None:
        """Remember the answer; `expires_in_s`: how long until the batch expires."""
        mask = b"" if len(delivered) == len(uids) else _mask(uids, delivered)
        keep = self._window if expires_in_s is None else min(self._window, expires_in_s)
        self._kept.put(batch_id, mask, max(keep, 0.0) + REPLY_GRACE_S)

    def seen(self, batch_id: str) -> bool:
        return batch_id in self._kept

    def get(self, batch_id: str, uids: Sequence[str]) -> tuple[list[str], list[str]] | None:
        """(delivered, missing) of the first attempt of `batch_id`, or None."""
        mask = self._kept.get(batch_id)
        if mask is None:
            return None
        if not mask:
            return list(uids), []
        if len(mask) != (len(uids) + 7) // 8:
            return None  # not the same batch after all
        delivered: list[str] = []
        missing: list[str] = []
        for i, uid in enumerate(uids):
            (delivered if mask[i >> 3] >> (i & 7) & 1 else missing).append(uid)
        return delivered, missing


def _mask(uids: Sequence[str], delivered: Sequence[str]) -> bytes:
    wrote = set(delivered)
    mask = bytearray((len(uids) + 7) // 8)
    for i, uid in enumerate(uids):
        if uid in wrote:
            mask[i >> 3] |= 1 << (i & 7)
    return bytes(mask)


class DeliverService:
    """Writes batches to local connections; counts what happened for tests and metrics."""

    def __init__(self, conns: LocalConnections, clock: Clock, recent: RecentIds) -> None:
        self._conns = conns
        self._clock = clock
        self._recent = recent
        self._replies = RecentReplies(clock)
        self.calls = 0  # delivery calls (DeliverMany, StreamCall)
        self.links = LinkCounts()  # delivery links
        self.batches = 0
        self.duplicates = 0
        self.expired = 0
        # Recipients written to (connections, for everyone batches), and how long after
        # the push was accepted: the dashboard's figures (router.stats).
        self.delivered = 0
        self.latency = LatencyHistogram()
        # P2P batches expired on arrival while their call had time left
        self.skewed = ThrottledLine(
            log,
            "P2P batches expire on arrival: one was %(late_ms)d ms past its expires_ms with "
            "%(left_s).1f s left on its call; this gateway's clock is probably ahead of the "
            "router's (keep clocks in sync, e.g. NTP)",
            every_s=LOG_EVERY_S,
            now=clock.monotonic,
        )
        self.check = BatchCheck()
        # Batches refused by `check` (nothing of them was written)
        self.rejected = ThrottledLine(
            log,
            "refused %(n)d batch(es), the last (batch_id %(batch_id).64r): %(problem)s",
            level=logging.ERROR,
            every_s=LOG_EVERY_S,
            now=clock.monotonic,
        )
        # Told of the recipients each bus batch reached (their push's receipt); the P2P
        # path's are known from its call's answer.
        self.report: Callable[[str, str, Sequence[str]], None] | None = None
        self.tracing: GatewayTracing | None = None  # a span per traced batch, when on

    def problem(self, batch: gateway_pb2.Batch) -> str | None:
        """What makes `batch` unfit to write (counted and logged), or None."""
        problem = self.check.problem(batch)
        if problem is not None:
            self.rejected.note(batch_id=batch.batch_id, problem=problem)
        return problem

    def deliver_call(
        self,
        batches: Sequence[gateway_pb2.Batch],
        call_left_s: float | None,
        traceparent: str = "",
    ) -> list[gateway_pb2.DeliverReply]:
        """One delivery call's batches (a DeliverMany, or a StreamCall on a link), each
        one's reply in order. All are checked before any is written: a call with a bad
        batch is refused whole (BadCall), never half-sent. `traceparent`: the call's,
        for its batches that carry none of their own."""
        self.calls += 1
        for i, batch in enumerate(batches):
            problem = self.problem(batch)
            if problem is not None:
                raise BadCall(f"batch {i}: {problem}")
        if traceparent:
            for batch in batches:
                if not batch.traceparent:
                    batch.traceparent = traceparent
        return [self.deliver(b, checked=True, call_left_s=call_left_s) for b in batches]

    def deliver(
        self,
        batch: gateway_pb2.Batch,
        log: str = "",
        checked: bool = False,
        call_left_s: float | None = None,
    ) -> gateway_pb2.DeliverReply:
        """Deliver one batch (from a delivery call or the bus), at most once per batch_id.
        `log`: the recovery log it is from (`b`, `g`, `o`); by default, as its mode says.
        `checked`: the caller already had `problem` pass it. A bad batch writes nothing.
        `call_left_s`: what the gRPC call that brought it has left of its deadline."""
        tracing = self.tracing
        start_ns = time.time_ns() if tracing is not None else 0
        reply = self._deliver(batch, log, checked, call_left_s)
        if tracing is not None and sampled(batch.traceparent):
            tracing.delivered(batch, reply, start_ns)
        reached = 0 if reply.duplicate else len(reply.delivered) or reply.connections
        if reached:
            self.delivered += reached
            self.latency.add(self._clock.now_ms() - batch.message.ts_ms, reached)
        if _log.isEnabledFor(logging.DEBUG):
            m = batch.message
            _log.debug(
                "batch %s: %d written, %d missing%s%s",
                batch.batch_id,
                len(reply.delivered) or reply.connections,
                len(reply.missing),
                ", expired" if reply.expired else "",
                ", a duplicate" if reply.duplicate else "",
                extra={"batch_id": batch.batch_id, "push_id": m.push_id, "msg_id": m.msg_id},
            )
        return reply

    def _deliver(
        self, batch: gateway_pb2.Batch, log: str, checked: bool, call_left_s: float | None
    ) -> gateway_pb2.DeliverReply:
        self.batches += 1
        if not checked and self.problem(batch) is not None:
            return gateway_pb2.DeliverReply()
        if batch.mode == gateway_pb2.MODE_P2P:
            return self._deliver_p2p(batch, call_left_s)
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
        message = message_of(batch)
        prefix = push_prefix(message)
        log = log or ("b" if batch.mode == gateway_pb2.MODE_BROADCAST else "g")
        report = self.report
        seq = seq_of(batch.epoch, batch.seq) if batch.seq else 0
        if batch.everyone:
            count = self._conns.deliver_all(prefix, log, seq, message.push_id)
            if report is not None and count:
                report(DELIVERED, message.push_id, self._conns.uids())
            return gateway_pb2.DeliverReply(connections=count)
        delivered, missing = self._conns.deliver(batch.uids, prefix, log, seq, message.push_id)
        if report is not None and delivered:
            report(DELIVERED, message.push_id, delivered)
        return gateway_pb2.DeliverReply(delivered=delivered, missing=missing)

    def _deliver_p2p(
        self, batch: gateway_pb2.Batch, call_left_s: float | None
    ) -> gateway_pb2.DeliverReply:
        """P2P batches are deduplicated by their answers (`RecentReplies`), apart from
        the bus's ids, and never written after their `expires_ms` (the router sets it to
        the end of its call when the push has no ttl_s) nor after their call's deadline:
        the caller has been told `failed` by then."""
        batch_id = batch.batch_id
        if batch_id:
            first = self._replies.get(batch_id, batch.uids)
            if first is not None:
                # A retried call whose first answer was lost: answer as the first attempt
                # did (even if the push has expired since: it was delivered in time).
                self.duplicates += 1
                return gateway_pb2.DeliverReply(
                    delivered=first[0], missing=first[1], duplicate=True
                )
            if self._replies.seen(batch_id):  # the same id with other uids: not written
                self.duplicates += 1
                return gateway_pb2.DeliverReply(duplicate=True)
        now_ms = self._clock.now_ms()
        late_ms = now_ms - batch.expires_ms if batch.expires_ms else 0
        if late_ms > 0 or (call_left_s is not None and call_left_s <= 0):
            self.expired += 1
            if late_ms > 0 and call_left_s is not None and call_left_s > SKEW_HINT_S:
                self._skew_hint(late_ms, call_left_s)
            return gateway_pb2.DeliverReply(expired=True)
        message = message_of(batch)
        delivered, missing = self._conns.deliver_p2p(
            batch.uids, batch.seqs, push_prefix(message), message.push_id, batch.epochs
        )
        if batch_id:
            expires_in = (batch.expires_ms - now_ms) / 1000 if batch.expires_ms else None
            self._replies.put(batch_id, batch.uids, delivered, expires_in)
        return gateway_pb2.DeliverReply(delivered=delivered, missing=missing)

    def _skew_hint(self, late_ms: int, call_left_s: float) -> None:
        # Expired by the wall clock while its call (whose deadline travels as a
        # duration) still has time: our clock and the router's disagree.
        self.skewed.note(late_ms=late_ms, left_s=call_left_s)

    @property
    def evicted_early(self) -> int:
        """Batch ids forgotten before their dedupe window ran out (both memories)."""
        return self._recent.evicted_early + self._replies.evicted_early
