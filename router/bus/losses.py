"""What a bus lost, counted: entries trimmed before a live subscriber had read them.

Pure bookkeeping, shared by every transport (only Redis Streams ever records a loss:
Pub/Sub drops what outlived its retention without telling the publisher, and the
memory bus keeps everything). The transport records each trim as it learns of it;
the publisher of a push takes that push's lost batches to count them as failed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["MAX_TRACKED_PUSHES", "BusLosses"]

# Pushes whose lost batch ids are remembered until their publisher takes them: a push
# that finished before its batches were trimmed never takes them (its own loss is in
# the log line and the per-gateway counts), so the oldest are forgotten.
MAX_TRACKED_PUSHES = 1000


@dataclass(slots=True)
class BusLosses:
    """Per (topic, subscriber): entries trimmed unread; per push: its lost batch ids."""

    unread_trimmed: dict[tuple[str, str], int] = field(default_factory=dict)
    groups_dropped: dict[str, int] = field(default_factory=dict)
    _by_push: OrderedDict[str, set[str]] = field(default_factory=OrderedDict)
    _taken: OrderedDict[str, set[str]] = field(default_factory=OrderedDict)

    def record(
        self,
        topic: str,
        per_subscriber: Mapping[str, int],
        batches: Iterable[tuple[str, str]] = (),
    ) -> None:
        """A trim of `topic`: entries each subscriber had not read, and the (push id,
        batch id) of every trimmed entry some live subscriber had not read."""
        for subscriber, n in per_subscriber.items():
            key = (topic, subscriber)
            self.unread_trimmed[key] = self.unread_trimmed.get(key, 0) + n
        for push_id, batch_id in batches:
            # A hedged duplicate is a second entry of the same batch: one batch, once.
            if batch_id in self._taken.get(push_id, ()):
                continue
            lost = self._by_push.get(push_id)
            if lost is None:
                lost = self._by_push[push_id] = set()
                while len(self._by_push) > MAX_TRACKED_PUSHES:
                    self._by_push.popitem(last=False)
            lost.add(batch_id)

    def dropped(self, topic: str, n: int) -> None:
        """`n` consumer groups of `topic` were deleted as belonging to departed gateways."""
        self.groups_dropped[topic] = self.groups_dropped.get(topic, 0) + n

    def take(self, push_id: str) -> int:
        """How many batches of the push were lost since the last take (each batch once)."""
        lost = self._by_push.pop(push_id, None)
        if not lost:
            return 0
        taken = self._taken.get(push_id)
        if taken is None:
            taken = self._taken[push_id] = set()
            while len(self._taken) > MAX_TRACKED_PUSHES:
                self._taken.popitem(last=False)
        taken |= lost
        return len(lost)
