"""Follows the gateway's topics in log order: bus batches through a sequencer each,
gaps and a lost last batch read from the recovery log, and the marks kept current."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from router.bus.base import BROADCAST
from router.recovery.base import OFFLINE_TOPIC, RecoveryReads
from shared.clock import Clock
from shared.errors import ImrouteError
from shared.proto import gateway_pb2
from socket_gateway.connections import Marks
from socket_gateway.delivery import DeliverService
from socket_gateway.sequencer import TopicSequencer

__all__ = ["TopicFollower"]

log = logging.getLogger(__name__)


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
        self._reads = reads
        self._service = service
        self._marks = marks
        self._topics = list(topics)
        self._clock = clock
        self._hold_s = hold_s
        self._poll_s = poll_s
        self.sequencers: dict[str, TopicSequencer] = {}

    async def start(self) -> None:
        """Start from the logs' heads: what was published before is not owed to us."""
        heads = await self._reads.heads([*self._topics, OFFLINE_TOPIC])
        for topic, head in zip(self._topics, heads, strict=False):
            self.sequencers[topic] = TopicSequencer(topic, head + 1, self._hold_s)
            self._mark(topic, head)
        self._marks.o = heads[-1]

    def offer(self, topic: str, batch: gateway_pb2.Batch) -> None:
        """A batch from the bus: delivered now if it is next, else when its turn comes."""
        sequencer = self.sequencers.get(topic)
        if sequencer is None or not batch.seq:
            self._service.deliver(batch)  # not logged (or not ours): as it comes
            return
        self._deliver(sequencer, sequencer.offer(batch, self._clock.monotonic()))

    def _deliver(self, sequencer: TopicSequencer, ready: list[gateway_pb2.Batch]) -> None:
        for batch in ready:
            self._service.deliver(batch)
        if ready:
            self._mark(sequencer.topic, sequencer.delivered_through)

    def _mark(self, topic: str, seq: int) -> None:
        if topic == BROADCAST:
            self._marks.b = seq
        else:
            self._marks.g = seq

    async def run(self) -> None:
        """Fill gaps that outlived the hold; read the heads every `poll_s`."""
        step = min(self._hold_s, self._poll_s) / 2
        next_poll = 0.0
        while True:
            await asyncio.sleep(step)
            now = self._clock.monotonic()
            try:
                if now >= next_poll:
                    next_poll = now + self._poll_s
                    await self._poll(now)
                for sequencer in self.sequencers.values():
                    await self._fill(sequencer)
            except ImrouteError as exc:
                log.warning("could not read the recovery log: %s", exc)

    async def _poll(self, now: float) -> None:
        heads = await self._reads.heads([*self.sequencers, OFFLINE_TOPIC])
        for sequencer, head in zip(self.sequencers.values(), heads, strict=False):
            sequencer.saw_head(head, now)
        self._marks.o = max(self._marks.o, heads[-1])

    async def _fill(self, sequencer: TopicSequencer) -> None:
        gap = sequencer.gap(self._clock.monotonic())
        if gap is None:
            return
        after, upto = gap
        history = await self._reads.read_topic(sequencer.topic, after, upto)
        lost = sequencer.lost
        self._deliver(
            sequencer, sequencer.fill(after, upto, history.batches, self._clock.monotonic())
        )
        if sequencer.lost > lost:
            log.warning(
                "%d batches of %s were neither on the bus nor in the recovery log (past "
                "IMROUTE_RECOVERY_TOPIC_MAX or the window); skipped",
                sequencer.lost - lost,
                sequencer.topic,
            )
