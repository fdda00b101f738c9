"""One fleet scenario: a fresh fleet, the driver's clients and load, a fault at
FAULT_AT_S of the load healed at HEAL_AT_S, and the checks on the records: every push
answered within the caller's retries (same Idempotency-Key), and from the clients'
own: nothing lost, nothing twice, and the pushes the fault touched in within the bound."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.fleet.driver import (
    BACKOFF_MAX_S,
    OPEN_TIMEOUT_S,
    PING_INTERVAL_S,
    PING_TIMEOUT_S,
    RETRIES_SAME,
    Plan,
)
from tests.fleet.fleet import GATEWAYS, Fleet, fleet
from tests.fleet.records import Figures, Records, figures, stories
from tests.integration.fault_clients import API_KEY, SECRET

FAULT_AT_S = 3.0  # of the load
HEAL_AT_S = 9.0
# Every push the fault touched reaches its client within this long of the heal (p99):
# a route lost with Redis is back within a heartbeat (2 s), a client cut off from its
# gateway finds another within its ping timeout and backoff (3 s here), a failed P2P
# delivery is retried past a circuit's cool-off (10 s).
LATENCY_BOUND_S = 12.0
# A client whose gateway went silent is on another one within this long of the cut:
# it finds the connection dead, fails RETRIES_SAME + 1 connects (each with its backoff),
# then dispatch sends it elsewhere; 5 s for dispatch, the resume and a loaded machine.
MOVE_BOUND_S = (
    PING_INTERVAL_S + PING_TIMEOUT_S + (RETRIES_SAME + 1) * (OPEN_TIMEOUT_S + BACKOFF_MAX_S) + 5.0
)

# A fault starts at FAULT_AT_S and returns what heals it at HEAL_AT_S (None: nothing to
# heal, e.g. a SIGKILL or a restart; the heal is then the moment the fault returns).
Fault = Callable[[Fleet], Callable[[], None] | None]


@dataclass(frozen=True)
class Load:
    clients: int = 48
    duration_s: float = 14.0
    p2p_per_s: float = 20.0
    multicast_every_s: float = 0.0  # 0: none
    multicast_size: int = 12
    broadcast_every_s: float = 0.0  # 0: none
    settle_quiet_s: float = 6.0
    settle_max_s: float = 25.0


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def run(
    name: str, tmp_path: Path, fault: Fault, load: Load, *, heal_at_s: float = HEAL_AT_S,
    bound_from_fault: bool = False, bound_s: float = LATENCY_BOUND_S, cluster: bool = False,
    **env: str,
) -> Figures:  # fmt: skip
    """Run the scenario and assert on what the clients recorded. `bound_from_fault`:
    `bound_s` runs from the fault, not the heal (for what clients must get round)."""
    out = tmp_path / "records.json"
    with fleet(tmp_path, cluster, **env) as f:
        plan = Plan(
            api_url=f.api_url, api_key=API_KEY, secret=SECRET,
            uids=[f"u{i:02d}" for i in range(load.clients)], out=str(out),
            gateways=list(GATEWAYS), duration_s=load.duration_s, p2p_per_s=load.p2p_per_s,
            multicast_every_s=load.multicast_every_s, multicast_size=load.multicast_size,
            broadcast_every_s=load.broadcast_every_s, settle_quiet_s=load.settle_quiet_s,
            settle_max_s=load.settle_max_s,
        )  # fmt: skip
        (tmp_path / "plan.json").write_text(json.dumps(asdict(plan)))
        argv = [sys.executable, "-m", "tests.fleet.driver", str(tmp_path / "plan.json")]
        try:
            f.start("driver", "clients", argv, "ready")
            start = float(f.read_until("driver", "load ")[-1].split()[1])
            sleep_until(start + FAULT_AT_S)
            fault_at = time.monotonic()
            heal = fault(f)
            healed_at = time.monotonic()  # a kill or restart is over once `fault` returns
            if heal is not None:
                sleep_until(start + heal_at_s)
                heal()
                healed_at = time.monotonic()
            f.read_until("driver", "done", load.duration_s + load.settle_max_s + 60)
        finally:
            logs = keep_logs(f, tmp_path)
    rec = Records.read(out)
    fig = figures(rec, fault_at, fault_at if bound_from_fault else healed_at)
    print(f"\n[fleet {name}] {fig.line()}; fault {healed_at - fault_at:.1f}s; SDK: {rec.sdk}")
    where = f"\nlogs: {logs}; notable:\n{notable(tmp_path)}"
    assert not rec.client_errors, f"clients that stopped: {rec.client_errors}{where}"
    # docs/guides/idempotency.md: a retry with the same key waits for the first try, then
    # gets its answer; one whose first try failed (a 5xx) runs again once the key is released.
    assert not rec.ledger.errors, f"[{name}] unanswered: {rec.ledger.errors[:10]}{where}"
    if fig.lost or fig.duplicated or fig.unexpected:
        wrong = stories(rec, tmp_path / "stories.txt")
        raise AssertionError(
            f"[{name}] {fig.line()}; {wrong} users wrong (stories: {tmp_path / 'stories.txt'})"
            f"; caller errors: {rec.ledger.errors[:5]}{where}"
        )
    assert fig.p99_after_heal_s <= bound_s, f"[{name}] {fig.line()}{where}"
    return fig


def keep_logs(f: Fleet, tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    folder.mkdir(exist_ok=True)
    for name in dict.fromkeys([*f.procs, *f.logs]):  # each once, in start order
        (folder / f"{name}.log").write_text("\n".join(f.output(name)))
    return folder


def notable(tmp_path: Path, last: int = 30) -> str:
    lines = [
        f"{log.stem}: {line}"
        for log in sorted((tmp_path / "logs").glob("*.log"))
        for line in log.read_text().splitlines()
        if re.search(r"WARNING|ERROR|Traceback|Error", line)
    ]
    return "\n".join(lines[-last:])
