"""The fault tests' books: who each push was addressed to, the loads, and the checks
that every client holds exactly what was addressed to it, once, in order."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from tests.integration.fault_clients import Got

RETRY_FOR_S = 30.0  # a caller with an Idempotency-Key retries an unanswered push this long
RETRY_EVERY_S = 0.5
# A fan-out job must end (done, no failed batch) within this long of being accepted: as
# long as a caller retries a push. A job accepted as a fault begins waits the fault out
# (a Cluster failover, 6 to 9 s in the fleet) and the outage back-off after it (2 s at
# most); how soon its pushes arrive after the heal is bounded by each scenario's p99.
JOB_FOR_S = RETRY_FOR_S


class Api(Protocol):
    """Where the pushes go: `imroute dev` (DevRun) or a fleet's push service."""

    @property
    def api_url(self) -> str: ...
    @property
    def auth(self) -> dict[str, str]: ...


@dataclass
class Ledger:
    """Who each accepted push was addressed to, in the order the pushes were accepted:
    P2P in the order POST /v1/push answered (one sequential task), fan-out in the
    order the jobs were issued (one sequential task, each job done before the next)."""

    p2p: dict[str, list[str]] = field(default_factory=dict)
    fanout: dict[str, list[str]] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    sent: Counter[str] = field(default_factory=Counter)
    answers: dict[str, Any] = field(default_factory=dict)  # key -> API answer / job record
    times: dict[str, float] = field(default_factory=dict)  # key -> loop time accepted
    # With a run's nonce, every push carries `Idempotency-Key: <nonce>:<key>` and is sent
    # again, with the same key and body, until it is answered (RETRY_FOR_S at most).
    idempotency: str | None = None
    retries: int = 0

    def add(self, kind: str, key: str, uids: Sequence[str]) -> None:
        book = self.p2p if kind == "p2p" else self.fanout
        for uid in uids:
            book.setdefault(uid, []).append(key)
        self.sent[kind] += 1

    def expected(self, uid: str) -> set[str]:
        return set(self.p2p.get(uid, [])) | set(self.fanout.get(uid, []))

    def total(self) -> int:
        return sum(map(len, self.p2p.values())) + sum(map(len, self.fanout.values()))


async def post(
    http: httpx.AsyncClient, stack: Api, ledger: Ledger, path: str, key: str, body: Any
) -> httpx.Response:
    """POST `body`; with `ledger.idempotency`, under its key and again until answered
    (transport errors, 5xx and 409 are tried again, RETRY_EVERY_S apart)."""
    if ledger.idempotency is None:
        return await http.post(f"{stack.api_url}{path}", json=body, headers=stack.auth)
    headers = {**stack.auth, "Idempotency-Key": f"{ledger.idempotency}:{key}"}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RETRY_FOR_S
    while True:
        try:
            resp = await http.post(f"{stack.api_url}{path}", json=body, headers=headers)
        except httpx.HTTPError:
            if loop.time() > deadline:
                raise
        else:
            if (resp.status_code < 500 and resp.status_code != 409) or loop.time() > deadline:
                return resp
        ledger.retries += 1
        await asyncio.sleep(RETRY_EVERY_S)


async def answered(
    http: httpx.AsyncClient, stack: Api, ledger: Ledger, path: str, key: str,
    body: dict[str, Any], status: int,
) -> httpx.Response | None:  # fmt: skip
    """POST `body` to `path`: the answer if its status is `status`, else None with what
    went wrong in the ledger."""
    try:
        resp = await post(http, stack, ledger, path, key, body)
    except httpx.HTTPError as exc:
        ledger.errors.append(f"POST {path} {key}: {exc!r}")
        return None
    if resp.status_code != status:
        ledger.errors.append(f"POST {path} {key}: {resp.status_code} {resp.text[:300]}")
        return None
    return resp


async def p2p_push(
    http: httpx.AsyncClient, stack: Api, ledger: Ledger, key: str, content: Any,
    to: Sequence[str],
) -> None:  # fmt: skip
    sent = {"to": list(to), "content": content}
    resp = await answered(http, stack, ledger, "/v1/push", key, sent, 200)
    if resp is None:
        return
    body = resp.json()
    reached = set(body["delivered"]) | set(body["queued"])
    if reached != set(to):
        ledger.errors.append(f"{key}: neither delivered nor queued: {set(to) - reached} {body}")
    ledger.outcomes["delivered"] += len(body["delivered"])
    ledger.outcomes["queued"] += len(body["queued"])
    ledger.outcomes["failed"] += len(body["failed"])
    if len(to) == 1:
        ledger.answers[key] = body
    ledger.times[key] = asyncio.get_running_loop().time()
    ledger.add("p2p", key, [uid for uid in to if uid in reached])  # those it promised


async def fanout_push(
    http: httpx.AsyncClient, stack: Api, ledger: Ledger, path: str, key: str,
    body: dict[str, Any], addressed: Sequence[str],
) -> None:  # fmt: skip
    """POST a broadcast or multicast and wait for its job to end."""
    resp = await answered(http, stack, ledger, path, key, body, 202)
    if resp is None:
        return
    push_id = resp.json()["push_id"]
    ledger.times[key] = asyncio.get_running_loop().time()
    ledger.add("fanout", key, addressed)
    deadline = time.monotonic() + JOB_FOR_S
    while time.monotonic() < deadline:
        try:
            got = await http.get(f"{stack.api_url}/v1/pushes/{push_id}", headers=stack.auth)
        except httpx.HTTPError:
            got = None
        job = got.json() if got is not None and got.status_code == 200 else {}
        if job.get("status") in ("done", "failed"):
            ledger.answers[key] = job
            if job["status"] != "done" or job.get("failed_batches"):
                ledger.errors.append(f"{key}: job {job}")
            return
        await asyncio.sleep(0.02)
    ledger.errors.append(f"{key}: job {push_id} did not finish within {JOB_FOR_S:.0f} s")


async def p2p_load(
    http: httpx.AsyncClient, stack: Api, ledger: Ledger, uids: Sequence[str],
    start: float, duration_s: float, rate: float, rng: random.Random,
    favourite: str | None = None, favourite_every: int = 0,
) -> None:  # fmt: skip
    """`rate` P2P pushes a second, each to one random user (every `favourite_every`th
    to `favourite`), one at a time, until `duration_s` after `start` (loop time)."""
    loop = asyncio.get_running_loop()
    n = 0
    while (due := start + n / rate) < start + duration_s:
        await asyncio.sleep(max(0.0, due - loop.time()))
        if favourite is not None and favourite_every and n % favourite_every == 0:
            uid = favourite
        else:
            uid = rng.choice(uids)
        await p2p_push(http, stack, ledger, f"p2p:{n}", {"kind": "p2p", "n": n}, [uid])
        n += 1


async def fanout_load(
    http: httpx.AsyncClient, stack: Api, ledger: Ledger, uids: Sequence[str],
    everyone: Sequence[str], start: float, duration_s: float, multicast_every_s: float,
    multicast_size: int, broadcast_every_s: float, rng: random.Random,
    always: Sequence[str] = (),
) -> None:  # fmt: skip
    """Multicasts to `multicast_size` random users (plus `always`) and online
    broadcasts (addressed to `everyone`), one job at a time, in time order."""
    events = sorted(
        [(k * multicast_every_s, "mc", k) for k in range(int(duration_s / multicast_every_s))]
        + [(0.5 + k * broadcast_every_s, "bc", k)
           for k in range(int((duration_s - 0.5) / broadcast_every_s) + 1)
           if 0.5 + k * broadcast_every_s < duration_s]
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    for at, kind, n in events:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        content = {"kind": kind, "n": n}
        if kind == "mc":
            to = [*rng.sample(list(uids), multicast_size), *always]
            body: dict[str, Any] = {"to": to, "content": content}
            await fanout_push(http, stack, ledger, "/v1/multicast", f"mc:{n}", body, to)
        else:
            body = {"content": content, "audience": {"online": True}}
            await fanout_push(http, stack, ledger, "/v1/broadcast", f"bc:{n}", body, everyone)


# ---------------------------------------------------------------------------- checking


def _order(keys: Sequence[str], want: Sequence[str]) -> tuple[list[str], list[str]]:
    """The `want` pushes in the order they came, and in the order they were accepted."""
    wanted = set(want)
    seen = [k for k in dict.fromkeys(keys) if k in wanted]
    arrived = set(seen)
    return seen, [k for k in want if k in arrived]


def check(
    uid: str, got: Sequence[Got], ledger: Ledger, groups: Mapping[str, str] | None = None
) -> list[str]:
    """What is wrong with what `uid` got: duplicates, missing or unexpected pushes, and
    pushes out of order: P2P among P2P (the user's log), multicasts among multicasts
    (the group's topic) and broadcasts among broadcasts (the broadcast topic).

    `groups` (gateway id -> group): a client that moved to another group has two
    multicast logs, and nothing orders them (docs/clients/protocol.md, "Duplicates"):
    a multicast accepted before the move that arrives after it may come after later
    ones that came live through the new group (`_seam_inversion`); any other
    inversion of two multicasts is out of order."""
    problems: list[str] = []
    ids = Counter(g.msg_id for g in got)
    keys = [g.key for g in got]
    if twice := [k for k, n in ids.items() if n > 1]:
        problems.append(f"msg_id twice: {twice}")
    if twice_keys := sorted(k for k, n in Counter(keys).items() if n > 1):
        problems.append(f"pushes twice: {twice_keys}")
    expected = ledger.expected(uid)
    if missing := expected - set(keys):
        problems.append(f"missing: {sorted(missing)}")
    if extra := set(keys) - expected:
        problems.append(f"not addressed to it: {sorted(extra)}")
    fanout = ledger.fanout.get(uid, [])
    for name, want in (
        ("p2p", ledger.p2p.get(uid, [])),
        ("multicast", [k for k in fanout if k.startswith("mc:")]),
        ("broadcast", [k for k in fanout if k.startswith("bc:")]),
    ):
        seen, order = _order(keys, want)
        if seen != order and not (
            name == "multicast" and groups and _seam_inversions_only(got, ledger, groups, order)
        ):
            problems.append(f"{name} out of order: got {seen}, accepted {order}")
    return problems


def _seam_inversions_only(
    got: Sequence[Got], ledger: Ledger, groups: Mapping[str, str], order: Sequence[str]
) -> bool:
    """Whether every inversion among the multicasts `order` (as accepted) is one of a
    move's seam: `a`, accepted before the client's first push through its new group and
    come after it (it may be in the old group's log, read again after the move), came
    after `b`, accepted once the client had left the old group (its last push through
    it) and come live (not replayed) through the new one."""
    moves: list[tuple[float, float]] = []  # (last push through the old group, first new)
    group, last_at = None, 0.0
    for g in got:
        now = groups.get(g.where or "")
        if now is None:
            continue
        if group is not None and now != group:
            moves.append((last_at, g.at))
        group, last_at = now, g.at
    first: dict[str, Got] = {}
    for g in got:
        first.setdefault(g.key, g)
    rank = {k: i for i, k in enumerate(order)}
    seen = sorted(order, key=lambda k: first[k].at)
    for i, a in enumerate(seen):
        for b in seen[:i]:  # b came before a
            if rank[b] > rank[a] and not _seam_inversion(first[a], first[b], ledger, moves):
                return False
    return True


def _seam_inversion(a: Got, b: Got, ledger: Ledger, moves: Sequence[tuple[float, float]]) -> bool:
    accepted_a, accepted_b = ledger.times.get(a.key), ledger.times.get(b.key)
    if accepted_a is None or accepted_b is None or b.recovered:
        return False
    return any(accepted_a < new <= a.at and accepted_b > old for old, new in moves)


def fanout_inversions(got: Sequence[Got], ledger: Ledger, uid: str) -> int:
    """Pairs of fan-out pushes (a multicast and a broadcast: two topics) that came in the
    other order than their jobs were issued. Each topic is delivered in its log order;
    across topics nothing orders them, so this is counted, not asserted."""
    seen, order = _order([g.key for g in got], ledger.fanout.get(uid, []))
    rank = {k: i for i, k in enumerate(order)}
    ranks = [rank[k] for k in seen]
    return sum(1 for i, a in enumerate(ranks) for b in ranks[i + 1 :] if a > b)


def explain(uid: str, got: Sequence[Got], ledger: Ledger, start: float) -> str:
    """What `uid` got (key, seconds since `start`, R for recovered, gateway) and, for
    each push addressed to it that it lacks, when it was accepted and the API's answer."""
    lines = [f"{uid} got: " + " ".join(
        f"{g.key}@{g.at - start:.2f}{'R' if g.recovered else ''}/{g.where}" for g in got
    )]  # fmt: skip
    for key in sorted(ledger.expected(uid) - {g.key for g in got}):
        lines.append(f"  missing {key} accepted @{ledger.times.get(key, 0.0) - start:.2f}: "
                     f"{ledger.answers.get(key)}")  # fmt: skip
    return "\n".join(lines)


async def settle(
    holders: Sequence[tuple[str, Sequence[Got]]], ledger: Ledger, quiet_s: float,
    max_s: float,
) -> float:  # fmt: skip
    """Wait until every holder has all its pushes, or nothing changed for `quiet_s`, or
    `max_s` passed; then `min(1, quiet_s)` more, so a late duplicate shows. Returns how
    long after the last accepted push the last push reached a client (0 if before)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    last_total, last_change = -1, start
    while True:
        total = sum(len(got) for _, got in holders)
        now = loop.time()
        if total != last_total:
            last_total, last_change = total, now
        done = all(ledger.expected(uid) <= {g.key for g in got} for uid, got in holders)
        if done or now - last_change >= quiet_s or now - start >= max_s:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(min(1.0, quiet_s))
    last_push = max(ledger.times.values(), default=start)
    last_arrival = max((g.at for _, got in holders for g in got), default=last_push)
    return max(0.0, last_arrival - last_push)
