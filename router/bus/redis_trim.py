"""How a Redis Streams topic is trimmed: never below what a live subscriber still needs,
and past the bound only with every unread entry counted.

Each publish is one script (`PUBLISH`): the XADD, then, about once a second per topic
and whenever the stream holds more than `maxlen` entries, a look at its consumer groups
(one per subscribing gateway):

- a group none of whose consumers has read for `idle_ms` belongs to a gateway that left
  (crashed, scaled in, renamed): it is deleted, so it holds nothing any more (a gateway
  that comes back under that id gets a new group at the stream's end, and follows its
  topics from their heads as every restarted gateway does);
- every other group is live, and the stream is trimmed (MINID) only below the oldest
  entry a live group still needs: its oldest pending entry (delivered, not yet acked),
  else the first after its last-delivered-id. While every live gateway keeps up the
  stream holds little more than what is in flight;
- past `maxlen` entries the oldest are trimmed all the same (memory stays bounded), and
  for each live group, those it had not read, or had not acked, are counted, exactly
  (the `bus-lost:{topic}` hash and the reply); so are the (push id, batch id) of each
  such entry, for the publishing job to count as failed. (A pending entry of a gateway
  that is running, only slow, may still be written from what it holds: so a count can
  exceed what its clients missed by up to one read, never fall short of it.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from router.bus.losses import BusLosses
from router.redis.scripts import Script
from shared.throttled import ThrottledLine

__all__ = [
    "LOST_TTL_MS",
    "MAX_EXCESS",
    "PUBLISH",
    "TrimReport",
    "TrimReporter",
    "parse_reply",
    "text",
]

log = logging.getLogger("router.bus.redis_streams")


# Entries trimmed past the bound by one publish at most: after IMROUTE_BUS_MAXLEN was
# lowered, the excess goes over the next publishes instead of one long script.
MAX_EXCESS = 1000
# The per-gateway loss counts stay readable for a week after the last loss.
LOST_TTL_MS = 7 * 86_400_000

# The XADD and the trim, one script (`publish.lua`: its comments say what it takes).
PUBLISH = Script.load(__package__, "publish")


@dataclass(frozen=True, slots=True)
class TrimReport:
    """What one publish's trim did: groups deleted, entries each live group lost unread,
    and the (push id, batch id) of every such entry."""

    entry_id: str
    dropped: tuple[str, ...] = ()
    lost: dict[str, int] = field(default_factory=dict)
    batches: tuple[tuple[str, str], ...] = ()


def parse_reply(reply: Sequence[Any]) -> TrimReport:
    """The script's reply (bytes from redis-py) as a TrimReport."""
    entry_id, dropped, lost, batches = reply
    flat_batches = [text(b) for b in batches]
    return TrimReport(
        text(entry_id),
        tuple(text(name) for name in dropped),
        {text(lost[i]): int(lost[i + 1]) for i in range(0, len(lost), 2)},
        tuple(zip(flat_batches[::2], flat_batches[1::2], strict=True)),
    )


def text(value: bytes | str | int) -> str:
    """A reply value as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class TrimReporter:
    """Counts and logs what the trims did; a gateway losing entries on every publish is
    logged once per 10 s, with what it lost meanwhile, and what it lost after the last
    line is said at the end of that line's 10 s (`ThrottledLine`)."""

    def __init__(self, maxlen: int, group_idle_s: float) -> None:
        self.losses = BusLosses()
        self._maxlen = maxlen
        self._group_idle_s = group_idle_s
        self._lines: dict[tuple[str, str], ThrottledLine] = {}

    def report(self, topic: str, report: TrimReport) -> None:
        if report.dropped:
            self.losses.dropped(topic, len(report.dropped))
            log.warning(
                "bus %s: deleted the consumer groups of %s, which read nothing for %.0fs "
                "(IMROUTE_BUS_GROUP_IDLE_S): gateways that left",
                topic,
                ", ".join(report.dropped),
                self._group_idle_s,
            )
        self.losses.record(topic, report.lost, report.batches)
        for group, n in report.lost.items():
            line = self._lines.get((topic, group))
            if line is None:
                line = self._lines[topic, group] = ThrottledLine(
                    log,
                    "bus %(topic)s: gateway %(group)s fell more than IMROUTE_BUS_MAXLEN "
                    "(%(maxlen)d) entries behind; %(n)d entries it had not read were "
                    "trimmed (%(total)d in all; imroute_bus_unread_trimmed_total)",
                )
            line.note(n, topic=topic, group=group, maxlen=self._maxlen)
