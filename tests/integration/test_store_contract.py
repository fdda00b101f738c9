"""The in-memory stores of `router.testing` against the Redis stores they stand in for:
each test runs one scenario on both (parametrized) and asserts the same answers, so a
fake that drifts from its real store fails here, not in a test that trusted it. The
last test of each store replays one long generated log of calls on both and compares
every answer."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio as aioredis

from push_service.stores import ReceiptStore
from router.jobs.base import (
    ORPHANED,
    Checkpoint,
    FailedBatch,
    Job,
    JobStatus,
    JobStore,
    PushCounters,
    out_of_attempts,
)
from router.jobs.store import RedisJobStore
from router.receipts.base import (
    ACKED,
    DELIVERED,
    EXPIRED,
    QUEUED,
    STATES,
    NewReceipt,
    ReceiptLimits,
)
from router.receipts.store import RedisReceiptStore
from router.recovery.base import RecoveryLimits
from router.recovery.store import RedisRecoveryStore
from router.testing import MemoryJobStore, MemoryReceiptStore, MemoryRecoveryLog
from shared.clock import ManualClock, SystemClock
from shared.errors import InvalidInput
from shared.keys import KeySchema
from shared.models import Message

pytestmark = pytest.mark.integration

LEASE_S = 10


@pytest.fixture(params=["memory", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> ManualClock:
    """The shared `clock`, started at today's wall time: the Redis stores set their keys'
    expiries in Redis's time, so a clock of 2023 would find them gone."""
    return ManualClock(wall_ms=SystemClock().now_ms())


@pytest.fixture
def receipts(kind: str, redis: aioredis.Redis, prefix: str) -> ReceiptStore:
    if kind == "memory":
        return MemoryReceiptStore()
    return RedisReceiptStore(redis, KeySchema(prefix), ReceiptLimits())


@pytest.fixture
def jobs(kind: str, redis: aioredis.Redis, prefix: str, clock: ManualClock) -> JobStore:
    if kind == "memory":
        return MemoryJobStore(clock, lease_s=LEASE_S)
    return RedisJobStore(redis, KeySchema(prefix), clock, lease_s=LEASE_S)


# ---------------------------------------------------------------------- receipts


@pytest.mark.parametrize("old", STATES)
@pytest.mark.parametrize("new", STATES)
async def test_a_recipients_state_only_moves_up(receipts: ReceiptStore, old: str, new: str) -> None:
    await receipts.record(NewReceipt("p", "p2p", 1, 1, {"u": old}), True)
    await receipts.mark(new, {"p": ["u"]})
    up = STATES.index(new) > STATES.index(old)  # expired -> delivered too
    assert await receipts.states("p", ["u"]) == {"u": new if up else old}
    counts = await receipts.counts("p")
    assert counts is not None
    state = new if up else old
    assert (counts.queued, counts.expired) == (state == QUEUED, state == EXPIRED)
    assert (counts.delivered, counts.acked) == (state in (DELIVERED, ACKED), state == ACKED)


async def test_an_ack_before_the_record_counts_and_expired_is_unacked(
    receipts: ReceiptStore,
) -> None:
    await receipts.mark(DELIVERED, {"p": ["late"]})  # dropped: no receipt yet
    await receipts.mark(ACKED, {"p": ["early"]})  # kept: it starts the receipt
    assert await receipts.counts("p") is None  # not recorded yet
    assert await receipts.states("p", ["early", "late"]) == {"early": ACKED}
    states = {"early": QUEUED, "u1": QUEUED, "u2": QUEUED, "u3": DELIVERED}
    await receipts.record(NewReceipt("p", "multicast", 4, 1, states), True)
    await receipts.mark(EXPIRED, {"p": ["u1", "u2"]})
    await receipts.mark(DELIVERED, {"p": ["u2"]})
    assert await receipts.states("p", ["early", "u1", "u2", "u3", "late"]) == {
        "early": ACKED,
        "u1": EXPIRED,
        "u2": DELIVERED,
        "u3": DELIVERED,
    }
    assert (await receipts.page("p", "unacked", None, 100)).uids == ["u1", "u2", "u3"]
    assert (await receipts.page("p", "acked", None, 100)).uids == ["early"]
    assert (await receipts.page("p", "queued", None, 100)).uids == []
    assert await receipts.unacked("p") == ["u1", "u2", "u3"]
    c = await receipts.counts("p")
    assert c is not None
    assert (c.mode, c.recipients, c.online, c.listable) == ("multicast", 4, 1, True)
    assert (c.delivered, c.acked, c.queued, c.expired) == (3, 1, 0, 1)


async def test_pages_meta_and_an_unknown_push(receipts: ReceiptStore) -> None:
    states = {f"u{n}": QUEUED for n in range(5)}
    meta = {"mi": "m1", "mt": "0", "fr": "svc"}
    await receipts.record(NewReceipt("p", "multicast", 5, 0, states, meta), True)
    first = await receipts.page("p", "queued", None, 2)
    second = await receipts.page("p", "queued", first.cursor, 2)
    last = await receipts.page("p", "queued", second.cursor, 2)
    assert (first.uids, first.cursor) == (["u0", "u1"], "u1")
    assert (second.uids, second.cursor) == (["u2", "u3"], "u3")
    assert (last.uids, last.cursor) == (["u4"], None)
    assert await receipts.meta("p") == meta
    with pytest.raises(InvalidInput):
        await receipts.page("p", "lost", None, 2)
    assert await receipts.counts("nope") is None
    assert await receipts.states("nope", ["u0"]) == {}
    assert (await receipts.page("nope", "acked", None, 2)).uids == []
    assert await receipts.unacked("nope") == []
    assert await receipts.meta("nope") == {}


async def test_a_counts_only_receipt(receipts: ReceiptStore) -> None:
    uids = ["a", "b", "c", "d", "e"]
    pending = dict.fromkeys(uids, QUEUED)
    await receipts.record(NewReceipt("p", "multicast", 5, 3, pending), False, due_ms=1)
    await receipts.mark(DELIVERED, {"p": ["a", "b"]})
    await receipts.mark(ACKED, {"p": ["a"]})
    await receipts.mark(ACKED, {"p": ["a"]})  # distinct uids
    await receipts.mark(EXPIRED, {"p": ["e"]})
    await receipts.mark(EXPIRED, {"p": ["e"]})  # counted per mark, not per uid
    counts = await receipts.counts("p")
    assert counts is not None
    assert (counts.recipients, counts.online, counts.listable) == (5, 3, False)
    # queued: not written anywhere yet (5, less 2 delivered and 2 expiry marks)
    assert (counts.delivered, counts.acked, counts.queued, counts.expired) == (2, 1, 1, 2)
    assert await receipts.states("p", uids) == {}
    assert (await receipts.page("p", "unacked", None, 10)).uids == []
    assert await receipts.unacked("p") == ["b", "c", "d", "e"]  # its pending set
    await receipts.settle("p")
    assert await receipts.unacked("p") == []
    # No message.unacked due: no pending set.
    await receipts.record(NewReceipt("q", "multicast", 5, 3, pending), False)
    assert await receipts.unacked("q") == []
    q = await receipts.counts("q")
    assert q is not None and counts.kept and q.kept


async def test_a_counts_only_receipt_of_a_push_not_kept(receipts: ReceiptStore) -> None:
    # store:false: said by every record of it; a listable receipt does not keep it.
    for _ in range(2):
        await receipts.record(NewReceipt("s", "broadcast", 3, 1, kept=False), False)
    await receipts.record(NewReceipt("l", "multicast", 3, 1, kept=False), True)
    s, listed = await receipts.counts("s"), await receipts.counts("l")
    assert s is not None and listed is not None
    assert (s.kept, s.queued, s.expired, listed.kept) == (False, 3, 0, True)


async def test_an_ack_before_a_counts_only_receipts_record_still_counts(
    receipts: ReceiptStore,
) -> None:
    """An ack that came first started the receipt as listable: the counts-only record
    counts it (before: acked 0, and the user named in message.unacked)."""
    await receipts.mark(ACKED, {"p": ["amy"]})
    await receipts.mark(DELIVERED, {"p": ["bob"]})  # the receipt exists: counted too
    states = {"amy": DELIVERED, "bob": QUEUED, "cyd": QUEUED}
    await receipts.record(NewReceipt("p", "p2p", 3, 2, states), False, due_ms=1)
    assert await _counted(receipts, "p") == (3, 2, 1, 1, 0)
    assert await receipts.unacked("p") == ["bob", "cyd"]
    assert await receipts.states("p", ["amy", "bob"]) == {}  # counts only
    await receipts.mark(ACKED, {"p": ["bob"]})
    assert await _counted(receipts, "p") == (3, 2, 2, 1, 0)
    assert await receipts.unacked("p") == ["cyd"]


async def test_a_counts_only_receipts_queued_falls_as_its_recipients_are_written(
    receipts: ReceiptStore,
) -> None:
    """queued is what was not written anywhere yet: its recipients less those delivered
    and expired (never below 0), not a snapshot of who was offline at the send."""
    await receipts.record(NewReceipt("m", "multicast", 4, 1, {}), False)
    assert await _counted(receipts, "m") == (4, 0, 0, 4, 0)
    await receipts.mark(DELIVERED, {"m": ["on"]})  # the online one, by the bus
    assert await _counted(receipts, "m") == (4, 1, 0, 3, 0)
    await receipts.mark(DELIVERED, {"m": ["late1", "late2"]})  # replays, on connect
    await receipts.mark(ACKED, {"m": ["late1"]})
    assert await _counted(receipts, "m") == (4, 3, 1, 1, 0)
    await receipts.mark(EXPIRED, {"m": ["gone", "gone"]})  # counted per mark: floored
    assert await _counted(receipts, "m") == (4, 3, 1, 0, 2)
    # A P2P push past the bound: its record counts whom the call delivered, and expired.
    states = {"a": DELIVERED, "b": QUEUED, "c": QUEUED, "x": EXPIRED}
    await receipts.record(NewReceipt("p", "p2p", 4, 2, states), False)
    assert await _counted(receipts, "p") == (4, 1, 0, 2, 1)
    await receipts.mark(DELIVERED, {"p": ["b"]})
    assert await _counted(receipts, "p") == (4, 2, 0, 1, 1)
    # A broadcast's receipt, as its job starts: counts of what the gateways report.
    await receipts.record(NewReceipt("b", "broadcast", 0, 0, {}), False)
    await receipts.mark(DELIVERED, {"b": ["u1", "u2"]})
    assert await _counted(receipts, "b") == (0, 2, 0, 0, 0)


async def _counted(receipts: ReceiptStore, push_id: str) -> tuple[int, int, int, int, int]:
    """(recipients, delivered, acked, queued, expired) of a counts-only receipt."""
    c = await receipts.counts(push_id)
    assert c is not None and not c.listable
    return c.recipients, c.delivered, c.acked, c.queued, c.expired


async def test_receipts_answer_alike_over_a_generated_log(
    redis: aioredis.Redis, prefix: str, clock: ManualClock
) -> None:
    fake, real = MemoryReceiptStore(), RedisReceiptStore(redis, KeySchema(prefix), ReceiptLimits())
    rnd = random.Random(26)
    pushes, uids = ["p0", "p1", "p2", "p3"], [f"u{n}" for n in range(8)]
    for step in range(300):
        push_id, op = rnd.choice(pushes), rnd.random()
        some = rnd.sample(uids, rnd.randint(1, 4))
        if op < 0.2:
            listable = push_id != "p3"
            states = {u: rnd.choice(STATES) for u in some}
            receipt = NewReceipt(push_id, "multicast", len(uids), 2, states, {"mi": str(step)})
            call: tuple[str, tuple[Any, ...]] = ("record", (receipt, listable, rnd.choice([0, 1])))
        elif op < 0.8:
            call = ("mark", (rnd.choice(STATES), {push_id: some}))
        elif op < 0.85:
            call = ("settle", (push_id,))
        else:
            call = (rnd.choice(["counts", "unacked", "meta"]), (push_id,))
        name, args = call
        assert await getattr(fake, name)(*args) == await getattr(real, name)(*args), (step, call)
    for push_id in pushes:
        for state in ("acked", "unacked", "queued"):
            page = await fake.page(push_id, state, None, 100)
            assert page == await real.page(push_id, state, None, 100), (push_id, state)
        assert await fake.states(push_id, uids) == await real.states(push_id, uids)
        assert await fake.counts(push_id) == await real.counts(push_id)


# -------------------------------------------------------------------------- jobs


def job(created: int, **fields: Any) -> Job:
    """Job "j" (a broadcast) as `get` reads it: queued, no counts, unless `fields` say."""
    queued = Job("j", "broadcast", JobStatus.QUEUED, 0, 0, 0, 0, 0, 0, None, created, None)
    return replace(queued, **fields)


async def test_a_hand_over_moves_the_epoch_on_and_is_no_attempt(
    jobs: JobStore, clock: ManualClock
) -> None:
    lease = await jobs.create("j", "broadcast", spec=b'{"x":1}')
    for _ in range(3):  # more hand-overs than max attempts
        old = lease
        assert await jobs.release(old, None)
        assert await jobs.get("j") == job(clock.now_ms(), status=JobStatus.QUEUED)
        assert not await jobs.progress(old, PushCounters(recipients=1))  # fenced
        claims, failed = await jobs.claim_lapsed(2)
        assert failed == 0 and len(claims) == 1
        lease = claims[0].lease
        assert (lease.epoch, claims[0].attempts) == (old.epoch + 2, 1)
        assert await jobs.get("j") == job(clock.now_ms(), status=JobStatus.RUNNING)
    assert not await jobs.release(old, None)
    assert not await jobs.finish(old, PushCounters(), None)
    assert await jobs.finish(lease, PushCounters(recipients=2, published=1), None)
    done = await jobs.get("j")
    assert done == job(
        clock.now_ms(),
        status=JobStatus.DONE,
        recipients=2,
        published=1,
        finished_at=clock.now_ms(),
    )
    assert not await jobs.progress(lease, PushCounters())  # ended
    assert await jobs.claim_lapsed(2) == ([], 0)


async def test_a_lapsed_lease_is_claimed_from_its_checkpoint_until_out_of_attempts(
    jobs: JobStore, clock: ManualClock
) -> None:
    created = clock.now_ms()
    lease = await jobs.create("j", "broadcast", spec=b"spec")
    assert (await jobs.get("j")) == job(created)
    failed_batch = FailedBatch("t", 3, None, "down")
    counters = PushCounters(recipients=5, batches=2, published=1, failed_batches=1)
    counters.failed.append(failed_batch)
    checkpoint = Checkpoint("u9", 1, counters.copy())
    assert await jobs.progress(lease, counters, checkpoint)
    clock.advance(LEASE_S - 1)
    assert await jobs.claim_lapsed(2) == ([], 0)  # not lapsed yet
    clock.advance(2)
    claims, failed = await jobs.claim_lapsed(2)
    assert failed == 0 and len(claims) == 1
    claim = claims[0]
    assert (claim.lease.epoch, claim.mode, claim.spec, claim.attempts) == (
        2,
        "broadcast",
        "spec",
        2,
    )
    assert claim.checkpoint == checkpoint
    assert not await jobs.progress(lease, PushCounters())  # the old holder is fenced
    expected = job(
        created,
        status=JobStatus.RUNNING,
        recipients=5,
        batches=2,
        published=1,
        failed_batches=1,
        attempts=2,
        failed=(failed_batch,),
    )
    assert await jobs.get("j") == expected
    # A release with no checkpoint keeps the counters, not the failed list.
    assert await jobs.release(claim.lease, None)
    assert await jobs.get("j") == job(
        created,
        recipients=5,
        batches=2,
        published=1,
        failed_batches=1,
        attempts=2,
    )
    (claim,), _ = await jobs.claim_lapsed(2)
    assert (claim.attempts, claim.checkpoint) == (2, checkpoint)
    clock.advance(LEASE_S + 1)
    assert await jobs.claim_lapsed(2) == ([], 1)  # a third attempt is one too many
    gone = await jobs.get("j")
    assert gone is not None
    assert (gone.status, gone.error, gone.finished_at, gone.attempts) == (
        JobStatus.FAILED,
        out_of_attempts(2),
        clock.now_ms(),
        2,
    )
    assert not await jobs.progress(claim.lease, PushCounters())


async def test_a_lapsed_job_that_cannot_resume_fails(jobs: JobStore, clock: ManualClock) -> None:
    lease = await jobs.create("j", "multicast")
    clock.advance(LEASE_S + 1)
    assert await jobs.claim_lapsed(3) == ([], 1)
    gone = await jobs.get("j")
    assert gone is not None
    assert (gone.status, gone.error, gone.finished_at) == (
        JobStatus.FAILED,
        ORPHANED,
        clock.now_ms(),
    )
    assert not await jobs.finish(lease, PushCounters(), None)
    assert await jobs.get("nope") is None


async def test_jobs_answer_alike_over_a_generated_log(
    redis: aioredis.Redis, prefix: str, clock: ManualClock
) -> None:
    fake = MemoryJobStore(clock, lease_s=LEASE_S)
    real = RedisJobStore(redis, KeySchema(prefix), clock, lease_s=LEASE_S)
    rnd = random.Random(26)
    ids = ["j0", "j1", "j2"]
    leases: dict[str, list[Any]] = {}  # push id -> every lease either store gave out
    for step in range(300):
        push_id, op = rnd.choice(ids), rnd.random()
        counters = PushCounters(recipients=step, published=rnd.randint(0, 3))
        if push_id not in leases:  # push ids are never reused
            spec = rnd.choice([None, b"spec"])
            call: tuple[str, tuple[Any, ...]] = ("create", (push_id, "broadcast", spec))
        elif op < 0.15:
            call = ("claim_lapsed", (rnd.randint(1, 3),))
        elif op < 0.25:
            clock.advance(rnd.choice([1, 4, LEASE_S + 1]))
            continue
        else:
            lease = rnd.choice(leases[push_id])
            checkpoint = rnd.choice([None, Checkpoint("u", step, counters.copy())])
            name = rnd.choice(["progress", "progress", "release", "finish"])
            args = {
                "progress": (lease, counters, checkpoint),
                "release": (lease, checkpoint),
                "finish": (lease, counters, rnd.choice([None, "boom"])),
            }[name]
            call = (name, args)
        name, args = call
        got, want = await getattr(fake, name)(*args), await getattr(real, name)(*args)
        assert got == want, (step, call)
        if name == "create":
            leases[push_id] = [got]
        elif name == "claim_lapsed":
            for claim in got[0]:
                leases[claim.lease.push_id].append(claim.lease)
        for push_id in ids:
            assert await fake.get(push_id) == await real.get(push_id), (step, call, push_id)


# ------------------------------------------------------- receipts derived from cursors


def recovery_and_receipts(
    kind: str, redis: aioredis.Redis, prefix: str, inbox_max: int = 100
) -> tuple[Any, ReceiptStore]:
    """A recovery log and receipts that read its cursors, memory or Redis."""
    if kind == "memory":
        log = MemoryRecoveryLog(inbox_max=inbox_max)
        return log, MemoryReceiptStore(log)
    keys, limits = KeySchema(prefix), RecoveryLimits(inbox_max=inbox_max)
    log = RedisRecoveryStore(redis, keys, SystemClock(), limits)
    return log, RedisReceiptStore(redis, keys, ReceiptLimits())


def message(n: int, first: str) -> Message:
    """Message n, its push id slot-tagged for `first` (a stored, listable P2P push's)."""
    push_id = f"{n:032x}.{KeySchema().user_slot_tag(first)}"
    return Message(f"m{n}", push_id, 0, "svc", b'{"n":1}', SystemClock().now_ms())


async def sent(
    log: Any, receipts: ReceiptStore, n: int, states: dict[str, str]
) -> tuple[str, dict[str, int]]:
    """Message n logged for `states`' uids and its receipt recorded: its push id, and
    each uid's position."""
    m = message(n, next(iter(states)))
    [(seqs, _)] = await log.append_queued_many([(m, list(states), 0)])
    positions = dict(zip(states, seqs, strict=True))
    await receipts.record(NewReceipt(m.push_id, "p2p", len(states), 1, states, {}, positions), True)
    return m.push_id, positions


async def test_a_tagged_p2p_receipt_derives_acks_from_each_users_acked_position(
    kind: str, redis: aioredis.Redis, prefix: str
) -> None:
    log, receipts = recovery_and_receipts(kind, redis, prefix)
    p1, at1 = await sent(log, receipts, 1, {"amy": DELIVERED, "bob": QUEUED, "cyd": DELIVERED})
    p2, at2 = await sent(log, receipts, 2, {"amy": DELIVERED})
    assert await receipts.states(p1, ["amy", "bob"]) == {"amy": DELIVERED, "bob": QUEUED}
    # Two devices of amy acking out of step: the furthest counts, an earlier never undoes it.
    await log.ack([("amy", at2["amy"]), ("bob", at1["bob"])])
    await log.ack([("amy", at1["amy"])])
    assert await receipts.states(p1, ["amy", "bob", "cyd"]) == {
        "amy": ACKED,
        "bob": ACKED,  # queued, then written on connect and acked (the mark may lag)
        "cyd": DELIVERED,
    }
    assert await receipts.states(p2, ["amy"]) == {"amy": ACKED}
    c = await receipts.counts(p1)
    assert c is not None
    assert (c.mode, c.recipients, c.online, c.listable) == ("p2p", 3, 1, True)
    assert (c.delivered, c.acked, c.queued, c.expired) == (3, 2, 0, 0)
    assert (await receipts.page(p1, "acked", None, 1)).uids == ["amy"]
    assert (await receipts.page(p1, "acked", "amy", 10)).uids == ["bob"]
    assert (await receipts.page(p1, "unacked", None, 10)).uids == ["cyd"]
    assert await receipts.unacked(p1) == ["cyd"]
    # A mark still moves a derived receipt's states (delivered by a replay) and keeps
    # the position it derives from.
    await receipts.mark(DELIVERED, {p1: ["cyd"]})
    await receipts.mark(EXPIRED, {p1: ["cyd"]})  # never down
    await log.ack([("cyd", at1["cyd"])])
    assert await receipts.states(p1, ["cyd"]) == {"cyd": ACKED}


async def test_an_entry_the_inbox_bound_pushed_out_unwritten_reads_expired(
    kind: str, redis: aioredis.Redis, prefix: str
) -> None:
    """An entry the bound pushed out of the inbox unwritten no longer waits for anyone:
    expired, and acks past it say nothing of it (the devices that acked never had it);
    an expired recipient never becomes acked."""
    log, receipts = recovery_and_receipts(kind, redis, prefix, inbox_max=2)
    p1, _ = await sent(log, receipts, 1, {"amy": QUEUED, "bob": EXPIRED})
    for n in (2, 3, 4):
        push_id, at = await sent(log, receipts, n, {"amy": QUEUED, "bob": DELIVERED})
    assert await receipts.states(p1, ["amy", "bob"]) == {"amy": EXPIRED, "bob": EXPIRED}
    assert await receipts.states(push_id, ["amy"]) == {"amy": QUEUED}
    await log.ack([("amy", at["amy"]), ("bob", at["bob"])])
    assert await receipts.states(p1, ["amy", "bob"]) == {"amy": EXPIRED, "bob": EXPIRED}
    assert await receipts.states(push_id, ["bob"]) == {"bob": ACKED}
    c = await receipts.counts(p1)
    assert c is not None and (c.delivered, c.acked, c.queued, c.expired) == (0, 0, 0, 2)


async def test_a_queued_recipient_a_connect_left_out_reads_expired_though_acks_pass_it(
    kind: str, redis: aioredis.Redis, prefix: str
) -> None:
    """An entry a connect left out for its ttl_s (the gateway marks it expired) reads
    expired once acks pass it: never delivered, never acked. One a replay wrote (its
    mark) reads acked, and so does one whose delivered mark was lost: a device that
    acked past it was written it."""
    log, receipts = recovery_and_receipts(kind, redis, prefix, inbox_max=3)
    p1, _ = await sent(log, receipts, 1, {"amy": QUEUED})
    p2, _ = await sent(log, receipts, 2, {"amy": QUEUED})
    p3, at3 = await sent(log, receipts, 3, {"amy": QUEUED})
    await receipts.mark(EXPIRED, {p1: ["amy"]})  # the replay left the first out
    await receipts.mark(DELIVERED, {p2: ["amy"]})  # and wrote the second; the third's lost
    await log.ack([("amy", at3["amy"])])
    assert await receipts.states(p1, ["amy"]) == {"amy": EXPIRED}
    assert await receipts.states(p2, ["amy"]) == {"amy": ACKED}
    assert await receipts.states(p3, ["amy"]) == {"amy": ACKED}
    c = await receipts.counts(p1)
    assert c is not None and (c.delivered, c.acked, c.queued, c.expired) == (0, 0, 0, 1)
    assert (await receipts.page(p1, "queued", None, 10)).uids == []
    assert await receipts.unacked(p1) == ["amy"]


async def test_an_ack_stays_once_the_inbox_bound_passes_its_entry(
    kind: str, redis: aioredis.Redis, prefix: str
) -> None:
    """Acked, then more than IMROUTE_INBOX_MAX messages came unacked (the inbox floor
    passed it): still acked, before and after the devices ack what came after."""
    log, receipts = recovery_and_receipts(kind, redis, prefix, inbox_max=2)
    p1, at1 = await sent(log, receipts, 1, {"amy": DELIVERED})
    await log.ack([("amy", at1["amy"])])
    assert await receipts.states(p1, ["amy"]) == {"amy": ACKED}
    later = [await sent(log, receipts, n, {"amy": QUEUED}) for n in (2, 3, 4, 5)]
    assert await receipts.states(p1, ["amy"]) == {"amy": ACKED}
    c = await receipts.counts(p1)
    assert c is not None and (c.delivered, c.acked) == (1, 1)
    # The bound pushed 2 and 3 out unwritten; a device gets 4 and 5 and acks them.
    await receipts.mark(DELIVERED, {p: ["amy"] for p, _ in later[2:]})
    await log.ack([("amy", later[-1][1]["amy"])])
    assert await receipts.states(p1, ["amy"]) == {"amy": ACKED}
    states = [(await receipts.states(p, ["amy"]))["amy"] for p, _ in later]
    assert states == [EXPIRED, EXPIRED, ACKED, ACKED]


async def test_an_ack_marked_before_a_tagged_receipts_record_still_counts(
    kind: str, redis: aioredis.Redis, prefix: str
) -> None:
    """A gateway's ack marks (each a flush of its own) that land before the router's
    record of a slot-tagged push are not overwritten by it: states only move up."""
    log, receipts = recovery_and_receipts(kind, redis, prefix)
    m = message(1, "amy")
    uids = ["amy", "bob", "cyd"]
    [(seqs, _)] = await log.append_queued_many([(m, uids, 0)])
    await receipts.mark(ACKED, {m.push_id: ["amy"]})
    await receipts.mark(ACKED, {m.push_id: ["bob"]})
    assert await receipts.counts(m.push_id) is None  # not recorded yet
    states = {"amy": DELIVERED, "bob": QUEUED, "cyd": DELIVERED}
    positions = dict(zip(uids, seqs, strict=True))
    await receipts.record(NewReceipt(m.push_id, "p2p", 3, 2, states, {}, positions), True)
    assert await receipts.states(m.push_id, uids) == {
        "amy": ACKED,
        "bob": ACKED,
        "cyd": DELIVERED,
    }
    c = await receipts.counts(m.push_id)
    assert c is not None and (c.delivered, c.acked, c.queued, c.expired) == (3, 2, 0, 0)
    assert (await receipts.page(m.push_id, "acked", None, 10)).uids == ["amy", "bob"]
    assert await receipts.unacked(m.push_id) == ["cyd"]
    # Later marks and acks go on as usual.
    await log.ack([("cyd", positions["cyd"])])
    assert await receipts.states(m.push_id, ["cyd"]) == {"cyd": ACKED}
