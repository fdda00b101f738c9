"""The clients host's program: `python -m tests.fleet.driver PLAN.json`.

It runs the fleet's users (one `ImrouteClient` each, recording every push it hands over,
with the time) and the caller (REST pushes with an `Idempotency-Key`, retried until
answered, recording what was accepted), both from tests/integration's fault helpers. It
says on stdout `ready` (every client has its first push), `load <t>` (the load began at
monotonic time t: the clock the test process shares) and `done` once the records are
written to the plan's `out` file, after the clients settled.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from imroute_client import ImrouteClient

from router.processes.devstack import listed_gateways
from shared.auth import issue_token
from shared.clock import SystemClock
from tests.integration.fault_clients import SdkUser
from tests.integration.fault_ledger import Ledger, fanout_load, p2p_load, p2p_push, settle

HELLO_S = 60.0
# The clients' settings: a dead connection is found within PING_INTERVAL_S +
# PING_TIMEOUT_S, a connect on the LAN that takes OPEN_TIMEOUT_S has failed, and after
# RETRIES_SAME + 1 failed connects the SDK asks dispatch to avoid that gateway.
PING_INTERVAL_S, PING_TIMEOUT_S = 1.0, 2.0
OPEN_TIMEOUT_S = 2.0
RETRIES_SAME = 2
BACKOFF_MAX_S = 1.0


@dataclass(frozen=True)
class Plan:
    api_url: str
    api_key: str
    secret: str
    uids: list[str]
    out: str
    gateways: list[str]
    duration_s: float
    p2p_per_s: float
    multicast_every_s: float  # 0: none
    multicast_size: int
    broadcast_every_s: float  # 0: none
    settle_quiet_s: float
    settle_max_s: float
    seed: int = 24

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def say(text: str) -> None:
    print(text, flush=True)


def wait_for_gateways(plan: Plan) -> None:
    """Until the push service lists every gateway (their heartbeats are in)."""
    host, port = plan.api_url.removeprefix("http://").rsplit(":", 1)
    deadline = time.monotonic() + HELLO_S
    while listed_gateways(host, int(port), plan.api_key, plan.gateways) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"the push service did not list {plan.gateways} in {HELLO_S}s")
        time.sleep(0.2)


async def run(plan: Plan) -> dict[str, Any]:
    ledger = Ledger(idempotency=secrets.token_hex(4))
    loop = asyncio.get_running_loop()
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=10.0, limits=limits) as http:
        users = {
            uid: SdkUser(uid, ImrouteClient(
                plan.api_url, issue_token(plan.secret, uid, 3600, SystemClock()), http=http,
                retries_same=RETRIES_SAME, backoff_max_s=BACKOFF_MAX_S,
                open_timeout_s=OPEN_TIMEOUT_S, ping_interval_s=PING_INTERVAL_S,
                ping_timeout_s=PING_TIMEOUT_S,
            ))
            for uid in plan.uids
        }  # fmt: skip
        for user in users.values():
            user.start()
        try:
            await p2p_push(http, plan, ledger, "hello:0", {"kind": "hello", "n": 0}, plan.uids)
            deadline = loop.time() + HELLO_S
            while not all(u.got for u in users.values()):
                if loop.time() > deadline:
                    raise SystemExit(f"not every client got its first push: {ledger.errors}")
                await asyncio.sleep(0.05)
            say("ready")
            start = loop.time()
            say(f"load {start}")
            rng = random.Random(plan.seed)
            loads = [p2p_load(http, plan, ledger, plan.uids, start, plan.duration_s,
                              plan.p2p_per_s, rng)]  # fmt: skip
            if plan.multicast_every_s or plan.broadcast_every_s:
                loads.append(fanout_load(
                    http, plan, ledger, plan.uids, plan.uids, start, plan.duration_s,
                    plan.multicast_every_s or 1e9, plan.multicast_size,
                    plan.broadcast_every_s or 1e9, random.Random(plan.seed + 1),
                ))  # fmt: skip
            await asyncio.gather(*loads)
            say(f"loaded {loop.time()}")
            holders = [(uid, u.got) for uid, u in users.items()]
            await settle(holders, ledger, plan.settle_quiet_s, plan.settle_max_s)
            return records(start, ledger, users)
        finally:
            await asyncio.gather(*(user.stop() for user in users.values()))


def records(start: float, ledger: Ledger, users: dict[str, SdkUser]) -> dict[str, Any]:
    stats = [u.client.stats for u in users.values()]
    return {
        "start": start,
        "ledger": {
            "p2p": ledger.p2p, "fanout": ledger.fanout, "times": ledger.times,
            "errors": ledger.errors, "outcomes": dict(ledger.outcomes),
            "sent": dict(ledger.sent), "answers": ledger.answers, "retries": ledger.retries,
        },
        "got": {uid: [asdict(g) for g in u.got] for uid, u in users.items()},
        "client_errors": {uid: repr(u.error) for uid, u in users.items() if u.error},
        "sdk": {
            "connects": sum(s.connects for s in stats),
            "dispatches": sum(s.dispatches for s in stats),
            "duplicates_dropped": sum(s.duplicates for s in stats),
            "incomplete": sum(s.incomplete for s in stats),
        },
    }  # fmt: skip


if __name__ == "__main__":
    the_plan = Plan(**json.loads(Path(sys.argv[1]).read_text()))
    wait_for_gateways(the_plan)
    Path(the_plan.out).write_text(json.dumps(asyncio.run(run(the_plan))))
    say("done")
