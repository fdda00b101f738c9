"""Receipts in Redis (`shared.keys.KeySchema.receipt`): one hash per push, updated by
single-key scripts (the HyperLogLogs share its hash tag), so it works on Redis Cluster.

Hash fields: `m` mode, `n` recipients, `on` online, `l` listable (1/0), `k` 0 on a
counts-only receipt of a `store:false` push (`Counts.kept`), the per-state
counters `cq`, `cx`, `cd`, `ca` (a counts-only receipt: `cx` only, its queued is
`unwritten`), the message's fields for the webhook (`mi`, `mt`, `fr`, `pv`, only while
a message.unacked is due), and for a listable push `u:<uid> -> q|x|d|a`.

A slot-tagged push (`shared.keys.slot_tagged`: a stored, listable P2P push) is written
in one `HSET` (no script), its values `<state><position>` (`stored_value`); its counts
are those of its recipients' states as `derive` reads them with their users' cursors
(the user's sequence hash: `e` epoch, `a` acked, `f` floor; `router.recovery`), not its
counters. That `HSET` sets its values over whatever is there, so a gateway's mark that
lands before it (an ack the gateway could not leave to the cursor, `derives_ack`) waits
beside them as `e:<uid> -> d|x|a` (`mark.lua`), and a read takes the higher of the two
(`with_early`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.receipts.base import (
    ACKED,
    DELIVERED,
    EXPIRED,
    QUEUED,
    Counts,
    Cursor,
    NewReceipt,
    ReceiptLimits,
    RecipientPage,
    derivable,
    derive,
    estimated,
    listed,
    recipient_page,
    stored_value,
    tally,
    unwritten,
    with_early,
)
from router.redis.autopipe import AutoPipeline
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import Script, ScriptRunner
from shared.keys import KeySchema, slot_tagged

__all__ = ["EARLY_TTL_MS", "MARK_CHUNK", "PENDING_TTL_MS", "RedisReceiptStore"]

# An ack that arrives before the router has recorded its push (the record follows the
# gateway's answer by a round trip) starts the receipt; it lives this long unless the
# record comes, so an ack for a push whose receipt expired leaves nothing for long.
EARLY_TTL_MS = 120_000
# uids per script call (Lua's unpack and argument limits).
MARK_CHUNK = 1000
# A counts-only push's set of recipients not acked yet outlives its event at most this.
PENDING_TTL_MS = 86_400_000

# Each script's comments say what it takes; a `_fn` file is a prelude of functions.
_RECORD = Script.load(__package__, "move_fn", "record")
_MARK = Script.load(__package__, "move_fn", "mark")
_CLAIM = Script.load(__package__, "claim")

_COUNTS = ("m", "n", "on", "l", "cq", "cx", "cd", "ca", "k")
_CURSOR = ("e", "a", "f")  # a user's sequence: epoch, acked position, inbox floor
_META = ("mi", "mt", "fr", "pv")


@dataclass(slots=True, eq=False)
class RedisReceiptStore:
    """All three halves: the router's `ReceiptLog`, the gateways' `ReceiptUpdates`, and
    the push service's `ReceiptReads`."""

    redis: RedisClient
    keys: KeySchema
    limits: ReceiptLimits
    auto: AutoPipeline | None = field(default=None, repr=False)
    _scripts: ScriptRunner = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._scripts = ScriptRunner(self.redis, (_RECORD, _MARK, _CLAIM), self.auto)

    # ------------------------------------------------------------------ ReceiptLog

    @translate_errors
    async def record(self, receipt: NewReceipt, listable: bool, due_ms: int = 0) -> None:
        calls = self._record_calls(receipt, listable, due_ms)
        if len(calls) == 1:
            await self._scripts.one(calls[0])
        else:
            await self._scripts.many(calls)

    @translate_errors
    async def record_many(self, receipts: Sequence[tuple[NewReceipt, bool, int]]) -> None:
        calls = [c for r, listable, due in receipts for c in self._record_calls(r, listable, due)]
        if calls:
            await self._scripts.many(calls)

    def _record_calls(
        self, receipt: NewReceipt, listable: bool, due_ms: int
    ) -> list[tuple[Any, ...]]:
        keys = self.keys.receipt(receipt.push_id)
        meta = [v for kv in receipt.meta.items() for v in kv]
        positions = receipt.positions
        if listable and positions and slot_tagged(receipt.push_id):
            fields: list[Any] = ["m", receipt.mode, "n", receipt.recipients]
            fields += ["on", receipt.online, "l", 1, *meta]
            for uid, state in receipt.states.items():
                fields += (f"u:{uid}", stored_value(state, positions[uid]))
            calls: list[tuple[Any, ...]] = [
                ("HSET", keys[0], *fields),
                ("PEXPIRE", keys[0], self.limits.ttl_ms),
            ]
            if due_ms:
                calls.append(("ZADD", self.keys.unacked_due(), "GT", due_ms, receipt.push_id))
            return calls
        pairs = [v for kv in receipt.states.items() for v in kv]
        # A counts-only push's pending set lives until its event is sent, or a day.
        pending_ms = PENDING_TTL_MS if due_ms and not listable else 0
        record = _RECORD.args(
            keys,
            self.limits.ttl_ms,
            receipt.mode,
            receipt.recipients,
            receipt.online,
            1 if listable else 0,
            pending_ms,
            1 if receipt.kept else 0,
            len(receipt.meta),
            *meta,
            *pairs,
        )
        if not due_ms:
            return [record]
        # Due no earlier than its last recipients' record plus the wait (GT).
        return [record, ("ZADD", self.keys.unacked_due(), "GT", due_ms, receipt.push_id)]

    @translate_errors
    async def claim_due(self, now_ms: int, lease_ms: int, limit: int) -> list[str]:
        """Push ids whose message.unacked is due, leased to the caller for `lease_ms`."""
        due = await self._scripts.one(
            _CLAIM.args((self.keys.unacked_due(),), now_ms, lease_ms, limit)
        )
        return [str(d) for d in due]

    @translate_errors
    async def unacked(self, push_id: str) -> list[str]:
        """The recipients no device acked, in uid order (the pending set of a counts-only
        push, or the states of a listable one)."""
        key, _, _, pending = self.keys.receipt(push_id)
        # A slot-tagged push's receipt is always listable: no look first.
        if not slot_tagged(push_id) and await self.redis.hget(key, "l") == "0":
            members: set[Any] = await self.redis.smembers(pending)
            return sorted(str(m) for m in members)
        states = await self._states(push_id, await self.redis.hgetall(key))
        return sorted(uid for uid, state in states.items() if state != ACKED)

    @translate_errors
    async def settle(self, push_id: str) -> None:
        """Its message.unacked went out (or had no one to name): not due again."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(self.keys.unacked_due(), push_id)
        pipe.delete(self.keys.receipt(push_id)[3])
        await pipe.execute()

    # ------------------------------------------------------------------ ReceiptUpdates

    @translate_errors
    async def mark(self, state: str, by_push: Mapping[str, Sequence[str]]) -> None:
        calls = []
        for push_id, uids in by_push.items():
            keys = self.keys.receipt(push_id)
            tagged = 1 if slot_tagged(push_id) else 0
            for start in range(0, len(uids), MARK_CHUNK):
                chunk = uids[start : start + MARK_CHUNK]
                calls.append(_MARK.args(keys, state, EARLY_TTL_MS, tagged, *chunk))
        if calls:
            await self._scripts.many(calls)

    # ------------------------------------------------------------------ ReceiptReads

    @translate_errors
    async def counts(self, push_id: str) -> Counts | None:
        key, acked_hll, delivered_hll, _ = self.keys.receipt(push_id)
        if slot_tagged(push_id):
            return await self._derived_counts(push_id, key)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(key, *_COUNTS)
        # redis-py's cluster pipeline refuses pfcount() (PFCOUNT may name keys of many
        # slots) but routes the command by its one key.
        pipe.execute_command("PFCOUNT", acked_hll)
        pipe.execute_command("PFCOUNT", delivered_hll)
        fields, acked_n, delivered_n = await pipe.execute()
        m, n, on, listable, cq, cx, cd, ca, kept = fields
        if m is None:
            return None
        recipients, expired = int(n or 0), int(cx or 0)
        if listable == "1":
            acked = int(ca or 0)
            delivered = int(cd or 0) + acked
            queued = int(cq or 0)
        else:  # HyperLogLog estimates
            acked, delivered = estimated(recipients, int(acked_n), int(delivered_n))
            queued = unwritten(recipients, delivered, expired)
        return Counts(
            mode=str(m),
            recipients=recipients,
            online=int(on or 0),
            delivered=delivered,
            acked=acked,
            queued=queued,
            expired=expired,
            listable=listable == "1",
            kept=kept != "0",
        )

    async def _derived_counts(self, push_id: str, key: str) -> Counts | None:
        """A slot-tagged push's counts: its recipients' states, derived, counted."""
        fields: dict[Any, Any] = await self.redis.hgetall(key)
        if "m" not in fields:
            return None
        by_state = tally((await self._states(push_id, fields)).values())
        acked = by_state[ACKED]
        return Counts(
            mode=str(fields["m"]),
            recipients=int(fields.get("n") or 0),
            online=int(fields.get("on") or 0),
            delivered=by_state[DELIVERED] + acked,
            acked=acked,
            queued=by_state[QUEUED],
            expired=by_state[EXPIRED],
            listable=True,
        )

    @translate_errors
    async def states(self, push_id: str, uids: Sequence[str]) -> dict[str, str]:
        if not uids:
            return {}
        key = self.keys.receipt(push_id)[0]
        if not slot_tagged(push_id):
            values = await self.redis.hmget(key, [f"u:{u}" for u in uids])
            return {u: str(v) for u, v in zip(uids, values, strict=True) if v is not None}
        # Its values, the marks that came before them, and the users' cursors in one
        # round trip (wait_ack_ms polls this).
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(key, [f"{f}:{u}" for u in uids for f in "ue"])
        self._read_cursors(pipe, uids)
        values, *cursors = await pipe.execute()
        states = {}
        for i, (uid, cursor) in enumerate(zip(uids, cursors, strict=True)):
            value, early = values[2 * i], values[2 * i + 1]
            if early is not None:
                value = with_early(None if value is None else str(value), str(early))
            if value is not None:
                states[uid] = derive(str(value), _cursor(cursor))
        return states

    async def _states(self, push_id: str, fields: dict[Any, Any]) -> dict[str, str]:
        """Each recipient's state in a listable receipt's `fields`: a slot-tagged push's
        derived with its users' cursors (read here, for the recipients they may move)."""
        values = {str(f)[2:]: str(v) for f, v in fields.items() if str(f).startswith("u:")}
        if not slot_tagged(push_id):
            return values
        for f, v in fields.items():
            if str(f).startswith("e:"):
                uid = str(f)[2:]
                values[uid] = with_early(values.get(uid), str(v))
        moving = [u for u, v in values.items() if derivable(v)]
        cursors: list[Any] = []
        if moving:
            pipe = self.redis.pipeline(transaction=False)
            self._read_cursors(pipe, moving)
            cursors = await pipe.execute()
        states = {u: v[0] for u, v in values.items()}
        for uid, cursor in zip(moving, cursors, strict=True):
            states[uid] = derive(values[uid], _cursor(cursor))
        return states

    def _read_cursors(self, pipe: Any, uids: Sequence[str]) -> None:
        """Each uid's cursor (`_cursor`) read in `pipe`, in order."""
        for uid in uids:
            pipe.hmget(self.keys.user_seq(uid), *_CURSOR)

    @translate_errors
    async def page(self, push_id: str, state: str, cursor: str | None, limit: int) -> RecipientPage:
        wanted = listed(state)
        key = self.keys.receipt(push_id)[0]
        # A listable receipt holds at most IMROUTE_RECEIPTS_MAX_RECIPIENTS uids: read
        # whole (HSCAN's order is not stable across pages of a changing hash).
        states = await self._states(push_id, await self.redis.hgetall(key))
        return recipient_page(states, wanted, cursor, limit)

    @translate_errors
    async def meta(self, push_id: str) -> dict[str, str]:
        key = self.keys.receipt(push_id)[0]
        values = await self.redis.hmget(key, list(_META))
        return {k: str(v) for k, v in zip(_META, values, strict=True) if v is not None}


def _cursor(fields: list[Any]) -> Cursor | None:
    """A user's cursor from its sequence's `e`, `a`, `f` (None: no sequence, or one
    written before the acked position was kept)."""
    epoch, acked, floor = fields
    if epoch is None or acked is None:
        return None
    return int(epoch), int(acked), int(floor or 0)
