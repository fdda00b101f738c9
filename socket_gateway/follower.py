"""Follows the gateway's topics in log order, and keeps their recent batches.

- `broadcast` and the group's topic come on the bus: each through a sequencer; a gap
  that outlives the hold, and a last batch the bus lost, are read from the log.
- `offline` (multicast recipients who had no route when it was resolved) is on no bus:
  its log is read as its head moves. A batch there that names a local connection is a
  multicast that raced that client's connect, and is delivered like any other.

The marks (how far each topic has been delivered) are what a live connection's `pos`
says for that topic. The last `RECENT` batches of each topic stay in memory, so a storm
of clients resuming from about the same place reads the batch logs once, not per client.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence

from router.bus.base import BROADCAST
from router.recovery.base import OFFLINE_TOPIC, LoggedBatch, RecoveryReads, TopicHistory
from shared.clock import Clock
from shared.periodic import Periodic
from shared.proto import gateway_pb2
from socket_gateway.connections import Marks
from socket_gateway.delivery import DeliverService
from socket_gateway.sequencer import TopicSequencer

__all__ = ["RECENT", "TopicFollower"]

log = logging.getLogger(__name__)

RECENT = 64  # batches kept per topic for replays (up to ~165 KB each with 1000 uids)

# The sequencers' counters, each summed over the topics for /metrics: name -> (help, the
# counter of one sequencer).
SEQUENCER_COUNTS: dict[str, tuple[str, Callable[[TopicSequencer], int]]] = {
    "batches_filled": (
        "Batches read from the recovery log because the bus had not brought them",
        lambda q: q.filled,
    ),
    "batches_lost": (
        "Batches neither on the bus nor still in the recovery log: skipped",
        lambda q: q.lost,
    ),
    "batches_late": (
        "Batches the bus brought after their turn (already delivered): dropped",
        lambda q: q.late,
    ),
    "log_epochs": (
        "Topic recovery logs found started again under a new epoch (Redis lost them)",
        lambda q: q.epochs,
    ),
}


class TopicFollower:
    def __init__(
        self,
        reads: RecoveryReads,
        service: DeliverService,
        marks: Marks,
        topics: Sequence[str],
        clock: Clock,
        *,
        hold_s: float = 0.5,
        poll_s: float = 1.0,
    ) -> None:
        """`topics`: the bus topics followed (broadcast, then the group's)."""
        self._reads = reads
        self._service = service
        self._marks = marks
        self._letters = {t: ("b" if t == BROADCAST else "g") for t in topics}
        self._letters[OFFLINE_TOPIC] = "o"
        self._clock = clock
        self._hold_s = hold_s
        self._poll_s = poll_s
        self._next_poll = 0.0  # monotonic: when the heads are read next
        self.sequencers: dict[str, TopicSequencer] = {}
        self.without_content = 0  # bus batches dropped because their content was gone
        self._recent: dict[str, deque[LoggedBatch]] = {}

    async def start(self) -> None:
        """Start from the logs' heads: what was published before is not owed to us."""
        topics = list(self._letters)
        for topic, head in zip(topics, await self._reads.heads(topics), strict=True):
            # Nothing brings the offline log early: it is read as soon as it moved.
            hold = 0.0 if topic == OFFLINE_TOPIC else self._hold_s
            self.sequencers[topic] = TopicSequencer(topic, head + 1, hold)
            self._recent[topic] = deque(maxlen=RECENT)
            setattr(self._marks, self._letters[topic], head)

    def metrics(self) -> dict[str, tuple[str, float]]:
        """The follower's counters for /metrics: name -> (help, value)."""
        seqs = self.sequencers.values()
        counts: dict[str, tuple[str, float]] = {
            name: (text, sum(counter(q) for q in seqs))
            for name, (text, counter) in SEQUENCER_COUNTS.items()
        }
        counts["batches_without_content"] = (
            "Bus batches whose content, stored once per push, was gone: dropped",
            self.without_content,
        )
        return counts

    async def offer(self, topic: str, batch: gateway_pb2.Batch) -> None:
        """A batch from the bus: delivered now if it is next, else when its turn comes."""
        if batch.message.content_stored and not (await self._reads.fill_content([batch]))[0]:
            # Its content is gone: never delivered empty. A logged batch leaves a hole
            # the sequencer reads from the log (which lacks it too) and counts as lost.
            self.without_content += 1
            log.warning(
                "batch %s of push %s on %s: its stored content is gone (past "
                "IMROUTE_BUS_CONTENT_TTL_S, or Redis lost it); not delivered",
                batch.batch_id,
                batch.message.push_id,
                topic,
            )
            return
        sequencer = self.sequencers.get(topic)
        if sequencer is None or not batch.seq:
            self._service.deliver(batch)  # not logged ("store": false): as it comes
            return
        epochs = sequencer.epochs
        self._deliver(sequencer, sequencer.offer(batch, self._clock.monotonic()))
        self._epoch_logged(sequencer, epochs)

    def recent(self, topic: str, after: int) -> tuple[int, TopicHistory] | None:
        """The batches after `after` through what was delivered, from memory, as far back
        as it holds every one: (where they start, the history), the log to be read for
        what is older; None for a topic this gateway does not follow."""
        sequencer = self.sequencers.get(topic)
        if sequencer is None:
            return None
        head = sequencer.delivered_through
        if after >= head:
            return (after, TopicHistory(head)) if after == head else None
        start, run = head, 0
        for logged in reversed(self._recent[topic]):
            if logged.seq != start or start <= after:
                break  # a seq the sequencer skipped as lost: the log says so
            start, run = start - 1, run + 1
        kept = self._recent[topic]
        return start, TopicHistory(head, list(kept)[len(kept) - run :] if run else [])

    def _deliver(self, sequencer: TopicSequencer, ready: list[gateway_pb2.Batch]) -> None:
        if not ready:
            return
        letter = self._letters[sequencer.topic]
        kept = self._recent[sequencer.topic]
        for batch in ready:
            self._service.deliver(batch, letter)
            kept.append(LoggedBatch(batch))
        setattr(self._marks, letter, sequencer.delivered_through)

    async def run(self) -> None:
        """Fill gaps that outlived the hold; read the heads every `poll_s`."""
        step = min(self._hold_s, self._poll_s) / 2
        await Periodic("reading the recovery log", self._step, step, log=log, at_once=False).run()

    async def _step(self) -> None:
        now = self._clock.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + self._poll_s
            await self._poll(now)
        for sequencer in self.sequencers.values():
            await self._fill(sequencer)

    async def _poll(self, now: float) -> None:
        heads = await self._reads.heads(list(self.sequencers))
        for sequencer, head in zip(self.sequencers.values(), heads, strict=True):
            epochs = sequencer.epochs
            self._deliver(sequencer, sequencer.saw_head(head, now))
            self._epoch_logged(sequencer, epochs)

    @staticmethod
    def _epoch_logged(sequencer: TopicSequencer, before: int) -> None:
        if sequencer.epochs > before:
            log.warning(
                "the recovery log of %s started again under a new epoch (Redis lost it: a "
                "restart without persistence, a failover that lost writes); following it "
                "from its first batch. Batches of the old log that never arrived are lost, "
                "and clients resuming from a position in it get complete: false",
                sequencer.topic,
            )

    async def _fill(self, sequencer: TopicSequencer) -> None:
        gap = sequencer.gap(self._clock.monotonic())
        if gap is None:
            return
        after, upto = gap
        history = await self._reads.read_topic(sequencer.topic, after, upto)
        lost = sequencer.lost
        self._deliver(
            sequencer,
            sequencer.fill(
                after, upto, [lb.batch for lb in history.batches], self._clock.monotonic()
            ),
        )
        if sequencer.lost > lost:
            log.warning(
                "%d batches of %s were neither on the bus nor in the recovery log (past "
                "IMROUTE_RECOVERY_TOPIC_MAX or the window); skipped",
                sequencer.lost - lost,
                sequencer.topic,
            )
