"""Recovery under faults: `imroute dev` as real processes, 400 SDK clients on real
sockets, 20 s of steady P2P, multicast and online-broadcast pushes, and one fault in the
middle:

- a kill: gw1 is SIGKILLed (no close frames, no goodbye); `imroute dev` restarts it;
- a drain: gw1 is drained, and one more client's TCP connection is cut silently (a
  proxy stops forwarding and closes nothing); it gives up on it later and resumes.

Afterwards every client must hold every push addressed to it exactly once, P2P in the
order the API accepted them, multicasts and broadcasts each in the order their jobs
were issued. Each topic (the user's P2P log, the group's topic, the broadcast topic) is
delivered in its own order; a multicast and a broadcast travel on two topics that
nothing orders against each other, so pairs of them that swap are counted in the
summary, not asserted. On a failure, the stack's output and each wrong client's story
(what it got, when, from which gateway; the API's answer for what it lacks) are written
to files under the test's tmp_path, named in the message.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import pytest
from imroute_client import ImrouteClient

from tests.integration.fault_clients import CutClient, DevRun, Got, SdkUser, dev_stack, drain_output
from tests.integration.fault_ledger import (
    Ledger,
    check,
    explain,
    fanout_inversions,
    fanout_load,
    p2p_load,
    p2p_push,
    settle,
)
from tests.integration.procs import pid_of

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

GATEWAYS, GROUPS = 4, 2
CLIENTS = 400
UIDS = [f"c{i:03d}" for i in range(CLIENTS)]
DURATION_S = 20.0  # of steady pushes
FAULT_AT_S = 10.0  # gw1 SIGKILLed (the kill test) or drained (the drain test)
P2P_PER_S = 20.0  # each to one random user
MULTICAST_EVERY_S = 1.0
MULTICAST_SIZE = 100  # random users of the 400
BROADCAST_EVERY_S = 2.0  # {"audience": {"online": true}}
DRAIN_WINDOW_S = 4.0  # IMROUTE_DRAIN_WINDOW_S of the drain test
CUT_AT_S = 7.0  # drain test: the extra client's connection goes silent
CUT_FOR_S = 5.0  # then it aborts its socket and resumes with since
CUT_UID = "x000"
CUT_P2P_EVERY = 5  # every 5th P2P push goes to the cut client
SETTLE_QUIET_S = 15.0  # after the pushes: done once nothing arrived for this long (a
# failed push is retried in the background, 1-8 s apart, past a circuit's 10-s cool-off)
SETTLE_MAX_S = 30.0
BACKOFF_MAX_S = 1.0  # the SDK clients' reconnect backoff cap
SEED = 11


@pytest.fixture(params=["redis-streams", "pubsub"])
def bus_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The stack's env for each bus transport (the Pub/Sub one skips without the
    emulator; the fixture puts PUBSUB_EMULATOR_HOST in os.environ, which base_env
    passes on to `imroute dev` and its children)."""
    if request.param == "pubsub":
        return {"IMROUTE_BUS_URL": f"pubsub://{request.getfixturevalue('pubsub_project')}"}
    return {}


@asynccontextmanager
async def sdk_users(dev: DevRun, uids: Sequence[str]) -> AsyncIterator[dict[str, SdkUser]]:
    """One started SDK client per uid, sharing one HTTP client for dispatch."""
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=30.0, limits=limits))
        users = {
            uid: SdkUser(uid, ImrouteClient(dev.api_url, dev.token(uid), http=http,
                                            backoff_max_s=BACKOFF_MAX_S))
            for uid in uids
        }  # fmt: skip
        for user in users.values():
            user.start()
        try:
            yield users
        finally:
            await asyncio.gather(*(user.stop() for user in users.values()))


async def hello(
    http: httpx.AsyncClient, dev: DevRun, ledger: Ledger, holders: dict[str, Sequence[Got]]
) -> None:
    """One P2P push to everyone (live, or from the inbox as they connect), and wait
    until each has it: from then on every client has a position to resume from."""
    await p2p_push(http, dev, ledger, "hello:0", {"kind": "hello", "n": 0}, list(holders))
    deadline = time.monotonic() + 60
    while not all(holders.values()):
        if time.monotonic() > deadline:
            without = [uid for uid, got in holders.items() if not got]
            raise AssertionError(f"{len(without)} clients never got hello: {without[:20]}")
        await asyncio.sleep(0.1)


def verify(
    dev: DevRun, tmp_path: Path, holders: dict[str, Sequence[Got]], ledger: Ledger,
    users: dict[str, SdkUser], start: float, text: str,
) -> None:  # fmt: skip
    """Every client got every push addressed to it once, in order; on failure the
    stack's output and each wrong client's story go to files named in the message."""
    errors = {uid: repr(u.error) for uid, u in users.items() if u.error is not None}
    assert not ledger.errors, report(dev, tmp_path, f"push errors: {ledger.errors[:20]}")
    assert not errors, report(dev, tmp_path, f"clients that stopped: {errors}")
    problems = {
        uid: p for uid, got in holders.items() if (p := check(uid, got, ledger, dev.groups))
    }
    if problems:
        stories = tmp_path / "problems.txt"
        stories.write_text(
            "\n\n".join(f"{uid}: {p}\n{explain(uid, holders[uid], ledger, start)}"
                         for uid, p in problems.items())
        )  # fmt: skip
        raise AssertionError(report(
            dev, tmp_path,
            f"{len(problems)} clients wrong (stories: {stories}):\n"
            + "\n".join(f"{uid}: {p}" for uid, p in list(problems.items())[:30]) + text,
        ))  # fmt: skip


def report(dev: DevRun, tmp_path: Path, what: str) -> str:
    output = drain_output(dev)
    log = tmp_path / "imroute-dev.log"
    log.write_text("\n".join(output))
    notable = [ln for ln in output if re.search(r"WARNING|ERROR|Traceback|exited|restart", ln)]
    return f"{what}\nimroute dev output: {log}\n" + "\n".join(notable[-60:])


def summary(
    name: str, holders: dict[str, Sequence[Got]], ledger: Ledger, settled_s: float,
    fault_at: float, users: dict[str, SdkUser],
) -> str:  # fmt: skip
    got = [g for seq in holders.values() for g in seq]
    recovered = [g for g in got if g.recovered and g.at >= fault_at]
    resumed = {uid for uid, seq in holders.items() if any(g.recovered and g.at >= fault_at
                                                          for g in seq)}  # fmt: skip
    stats = [u.client.stats for u in users.values()]
    inversions = [fanout_inversions(seq, ledger, uid) for uid, seq in holders.items()]
    return (
        f"\n[{name}] pushes sent: {dict(ledger.sent)}; addressed: {ledger.total()}; "
        f"received: {len(got)}; recovered after the fault: {len(recovered)} "
        f"(by {len(resumed)} clients); P2P answers: {dict(ledger.outcomes)}; "
        f"settled {settled_s:.1f}s after the last push; SDK duplicates dropped: "
        f"{sum(s.duplicates for s in stats)}; SDK connects: {sum(s.connects for s in stats)}, "
        f"dispatches: {sum(s.dispatches for s in stats)}, incomplete resumes: "
        f"{sum(s.incomplete for s in stats)}; multicast/broadcast pairs in the other order "
        f"than issued (two topics, not asserted): {sum(inversions)} "
        f"at {sum(1 for n in inversions if n)} clients"
    )


async def load(
    http: httpx.AsyncClient, dev: DevRun, ledger: Ledger, everyone: Sequence[str],
    start: float, favourite: str | None = None,
) -> None:  # fmt: skip
    """DURATION_S of steady pushes from `start`: P2P from one task, fan-out from another."""
    rng = random.Random(SEED)
    every = CUT_P2P_EVERY if favourite is not None else 0
    always = [favourite] if favourite is not None else []
    await asyncio.gather(
        p2p_load(http, dev, ledger, UIDS, start, DURATION_S, P2P_PER_S, rng, favourite, every),
        fanout_load(http, dev, ledger, UIDS, everyone, start, DURATION_S, MULTICAST_EVERY_S,
                    MULTICAST_SIZE, BROADCAST_EVERY_S, random.Random(SEED + 1), always),
    )  # fmt: skip


async def test_a_sigkilled_gateway_s_clients_resume_with_every_push_once_in_order(
    redis_url: str, prefix: str, tmp_path: Path,
    bus_env: dict[str, str],
) -> None:  # fmt: skip
    """The kill: gw1 SIGKILLed at FAULT_AT_S of DURATION_S of steady pushes."""
    began = time.monotonic()
    ledger = Ledger()
    with dev_stack(redis_url, prefix, tmp_path, GATEWAYS, GROUPS, **bus_env) as dev:
        async with httpx.AsyncClient(timeout=30.0) as http, sdk_users(dev, UIDS) as users:
            holders: dict[str, Sequence[Got]] = {uid: u.got for uid, u in users.items()}
            await hello(http, dev, ledger, holders)
            victim = pid_of(dev.proc.pid, "gw1")
            start = asyncio.get_running_loop().time()

            async def kill() -> None:
                await asyncio.sleep(FAULT_AT_S)
                os.kill(victim, signal.SIGKILL)

            await asyncio.gather(load(http, dev, ledger, UIDS, start), kill())
            settled = await settle(list(holders.items()), ledger, SETTLE_QUIET_S, SETTLE_MAX_S)
            name = f"sigkill, {bus_env.get('IMROUTE_BUS_URL', 'redis-streams')}"
            text = summary(name, holders, ledger, settled, start + FAULT_AT_S, users)
            print(f"{text}; {time.monotonic() - began:.0f}s so far", flush=True)

            verify(dev, tmp_path, holders, ledger, users, start, text)
            after = [g for seq in holders.values() for g in seq if g.at >= start + FAULT_AT_S]
            assert any(g.recovered for g in after), f"no replay after the kill{text}"
            said = "\n".join(drain_output(dev))
            assert "gw1 exited with code -9" in said and "gw1 restarted" in said, said[-3000:]


async def test_a_drain_and_a_silent_cut_lose_and_double_nothing(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The drain (Redis Streams): gw1 drained at FAULT_AT_S; one more client, a raw
    WebSocket through a proxy, cut silently at CUT_AT_S, gives up on that socket
    CUT_FOR_S later and resumes directly with `since`."""
    began = time.monotonic()
    ledger = Ledger()
    everyone = [*UIDS, CUT_UID]
    env = {"IMROUTE_DRAIN_WINDOW_S": str(DRAIN_WINDOW_S)}
    with dev_stack(redis_url, prefix, tmp_path, GATEWAYS, GROUPS, **env) as dev:
        cut = CutClient(CUT_UID, dev)
        async with httpx.AsyncClient(timeout=30.0) as http, sdk_users(dev, UIDS) as users:
            try:
                await cut.start(http)
                holders: dict[str, Sequence[Got]] = {uid: u.got for uid, u in users.items()}
                holders[CUT_UID] = cut.got
                await hello(http, dev, ledger, holders)
                start = asyncio.get_running_loop().time()

                async def drain() -> None:
                    await asyncio.sleep(FAULT_AT_S)
                    url = f"{dev.api_url}/v1/gateways/gw1/drain"
                    resp = await http.post(url, headers=dev.auth)
                    assert resp.status_code == 202, resp.text

                async def cut_then_resume() -> None:
                    await asyncio.sleep(CUT_AT_S)
                    await cut.cut_and_resume(http, CUT_FOR_S)

                await asyncio.gather(
                    load(http, dev, ledger, everyone, start, favourite=CUT_UID),
                    drain(),
                    cut_then_resume(),
                )
                settled = await settle(list(holders.items()), ledger, SETTLE_QUIET_S, SETTLE_MAX_S)
                text = summary("drain + silent cut", holders, ledger, settled,
                               start + CUT_AT_S, users)  # fmt: skip
                cut_recovered = sum(g.recovered for g in cut.got)
                text += (
                    f"; cut client: {len(cut.got)} pushes, {cut_recovered} of them replayed, "
                    f"gateways {cut.gateways}, reconnects refused {cut.refusals}, "
                    f"other frames {cut.frames}"
                )
                print(f"{text}; {time.monotonic() - began:.0f}s so far", flush=True)

                verify(dev, tmp_path, holders, ledger, users, start, text)
                # The cut mattered: what went into the silent socket came back in the
                # replay, which said it was complete; one recovered frame per connection.
                assert cut_recovered > 0, text
                recovered = [f for f in cut.frames if f.get("type") == "recovered"]
                assert len(recovered) == 2 and recovered[-1]["complete"] is True, cut.frames
                assert sum(u.client.stats.moves for u in users.values()) > 0, "nobody moved"
            finally:
                await cut.stop()
