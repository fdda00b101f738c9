"""The `pos` of a push frame: where a connection stands in each recovery log of its user.

A user's messages come from four logs (`router.recovery` keeps them):

- ``p``: the user's own P2P log (one dense sequence per user);
- ``b``: the broadcast topic's batch log (one dense sequence for the fleet);
- ``o``: the log of multicast recipients who had no route when their multicast was
  resolved (read on resume only; no gateway delivers it live);
- ``g`` in ``group``: the batch log of the gateway group the connection was in.

**Epochs.** Every log's sequence is born with an *epoch*: the Redis server's clock, in
ms, when its counter was created (Centrifugo's offset-plus-epoch design). A Redis that
restarts empty, or a Cluster shard that lost a key, starts the counter again at 1 under
a new epoch, so a number alone could name two entries. imroute therefore handles each
place in a log as one integer, ``seq = epoch << EPOCH_SHIFT | n`` (`seq_of`): the
counter `n` in the low 40 bits, the epoch above. Seqs of one epoch are dense (n, n+1,
...), and a later epoch's are all greater than an earlier one's, so the gateway's rules
("deliver in order", "a hole is read from the log", "at most once") keep working across a
data loss, and a jump to a new epoch is seen as one (`epoch_of`). Epoch 0 names a
counter written before epochs existed (or a test's); the wire carries `n` and the epoch
apart (`Batch.seq` and `Batch.epoch`, `Batch.seqs` and `Batch.epochs`).

A position is the highest entry of each log that the connection was written (0: none).
Resuming from it replays, per log, what comes after; a position from another epoch than
the log's now resumes `complete: false` (what it stood for is gone). Its text is
``2~<p>~<b>~<o>~<group>~<g>`` with each log's place as ``<n>.<epoch>``: URL-safe (RFC
3986 unreserved characters), at most 256 characters, and meaningless for another user,
because each replay reads the resuming user's own P2P log and only those batches that
list that user. Version 1 texts (``1~<p>~<b>~<o>~<group>~<g>``, no epochs) are still
read, as epoch 0, and written for a position whose epochs are all 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.keys import ID_PATTERN

__all__ = [
    "EPOCH_SHIFT",
    "MAX_POS_CHARS",
    "Pos",
    "counter_of",
    "decode_pos",
    "encode_pos",
    "epoch_of",
    "first_after",
    "seq_of",
]

MAX_POS_CHARS = 256
EPOCH_SHIFT = 40  # a log holds at most 2**40 entries per epoch (decades at 1000/s)
_COUNTER = (1 << EPOCH_SHIFT) - 1
_INT = r"(0|[1-9][0-9]{0,17})"  # below 2**63, no leading zeros: one text per position
_POS_V1 = re.compile(rf"1~{_INT}~{_INT}~{_INT}~({ID_PATTERN.pattern})?~{_INT}")
_AT = rf"{_INT}\.{_INT}"
_POS_V2 = re.compile(rf"2~{_AT}~{_AT}~{_AT}~({ID_PATTERN.pattern})?~{_AT}")


def seq_of(epoch: int, n: int) -> int:
    """The seq of entry `n` of a log born at `epoch` (n 0: before its first entry)."""
    return epoch << EPOCH_SHIFT | n


def first_after(prev: int, seq: int) -> int:
    """The seq that comes right after `prev` in the log `seq` is of: prev + 1 within one
    epoch; the new log's first when `prev` is of another epoch or 0 (nothing yet)."""
    if prev and epoch_of(prev) == epoch_of(seq):
        return prev + 1
    return seq_of(epoch_of(seq), 1)


def epoch_of(seq: int) -> int:
    return seq >> EPOCH_SHIFT


def counter_of(seq: int) -> int:
    return seq & _COUNTER


@dataclass(frozen=True, slots=True)
class Pos:
    p: int = 0
    b: int = 0
    o: int = 0
    group: str = ""
    g: int = 0


def encode_pos(p: int, b: int, o: int, group: str, g: int) -> str:
    """The text of a position (the components as the connection holds them: seqs)."""
    if p <= _COUNTER and b <= _COUNTER and o <= _COUNTER and g <= _COUNTER:
        return f"1~{p}~{b}~{o}~{group}~{g}"
    return f"2~{_at(p)}~{_at(b)}~{_at(o)}~{group}~{_at(g)}"


def _at(seq: int) -> str:
    return f"{seq & _COUNTER}.{seq >> EPOCH_SHIFT}"


def decode_pos(text: str | None) -> Pos | None:
    """The position `text` names, or None when it is absent, too long or not ours."""
    if not text or len(text) > MAX_POS_CHARS:
        return None
    m = _POS_V1.fullmatch(text)
    if m is not None:
        p, b, o, group, g = m.groups()
        return Pos(int(p), int(b), int(o), group or "", int(g))
    m = _POS_V2.fullmatch(text)
    if m is None:
        return None
    pn, pe, bn, be, on, oe, group, gn, ge = m.groups()
    parts = [(int(pn), int(pe)), (int(bn), int(be)), (int(on), int(oe)), (int(gn), int(ge))]
    if any(n > _COUNTER or e >= 1 << 62 for n, e in parts):
        return None
    p, b, o, g = (seq_of(e, n) for n, e in parts)
    return Pos(p, b, o, group or "", g)
