"""bench.redis_cost's pure part: commandstats and memory snapshots in, figures per push
out (no I/O but the report's print)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "CONTENT_BYTES",
    "PER_OFFLINE_USER",
    "content_of",
    "key_family",
    "memory_delta",
    "message_bytes",
    "monitor_sources",
    "net_calls",
    "per",
    "report",
    "script_calls",
]

CONTENT_BYTES = 50
PER_OFFLINE_USER = 50  # pushes per offline user: inside IMROUTE_INBOX_MAX (100)
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
# Key families a push writes; the rest (fleet records, stats buckets, routes) is background.
MESSAGE_FAMILIES = ("useq", "ulog", "uinbox", "rcpt", "rcpt-a", "rcpt-d", "rcpt-p", "content")


def content_of(seq: int) -> dict[str, Any]:
    """A push's content, exactly CONTENT_BYTES of compact JSON."""
    empty = len(json.dumps({"seq": seq, "t": ""}, separators=(",", ":")))
    return {"seq": seq, "t": "x" * (CONTENT_BYTES - empty)}


def net_calls(busy: Mapping[str, int], idle: Mapping[str, int]) -> dict[str, int]:
    """Per-command calls of a measurement minus those of the idle one, zeros left out,
    largest first."""
    names = set(busy) | set(idle)
    net = {n: busy.get(n, 0) - idle.get(n, 0) for n in names}
    return dict(sorted(((n, v) for n, v in net.items() if v), key=lambda kv: (-kv[1], kv[0])))


def script_calls(calls: Mapping[str, int]) -> int:
    return sum(n for name, n in calls.items() if name.lower() in SCRIPT_COMMANDS)


def key_family(key: str, prefix: str) -> str:
    """`{prefix}rcpt:{abc}` -> "rcpt", `{prefix}{stats}:123` -> "{stats}"."""
    rest = key.removeprefix(prefix)
    if rest.startswith("{"):
        return rest[: rest.find("}") + 1] if "}" in rest else rest
    return rest.split(":", 1)[0]


def memory_delta(
    before: Mapping[str, int], after: Mapping[str, int], prefix: str
) -> dict[str, dict[str, int]]:
    """family -> {"bytes": growth, "keys": keys created - keys gone} between two snapshots
    (key -> MEMORY USAGE)."""
    out: dict[str, dict[str, int]] = {}
    for key in set(before) | set(after):
        grew = after.get(key, 0) - before.get(key, 0)
        made = (key in after) - (key in before)
        if grew or made:
            fam = out.setdefault(key_family(key, prefix), {"bytes": 0, "keys": 0})
            fam["bytes"] += grew
            fam["keys"] += made
    return dict(sorted(out.items()))


def message_bytes(delta: Mapping[str, Mapping[str, int]]) -> int:
    return sum(v["bytes"] for fam, v in delta.items() if fam in MESSAGE_FAMILIES)


def monitor_sources(lines: Iterable[str], gap_us: int = 100) -> dict[str, Any]:
    """MONITOR lines (`+1733.000100 [0 127.0.0.1:5000] "evalsha" ...`, then `[0 lua]` for
    each command the script runs) -> {"client": {cmd: n}, "script": {cmd: n},
    "round_trips": n}. A client's command starts a new round trip unless it follows the
    same client's previous line (its scripts' included) within `gap_us`: a pipeline's
    commands run back to back, a second round trip waits for the client to read the
    reply and write again (well over 100 µs from Python)."""
    out: dict[str, Any] = {"client": {}, "script": {}, "round_trips": 0}
    last_client, last_at = "", 0.0
    for line in lines:
        head, sep, rest = line.partition("] ")
        if not sep or not rest.startswith('"') or " [" not in head:
            continue
        stamp, source = head.lstrip("+").split(" [", 1)
        at, who = float(stamp), source.split(" ", 1)[-1]
        side = "script" if who == "lua" else "client"
        if side == "client" and (who != last_client or (at - last_at) * 1e6 > gap_us):
            out["round_trips"] += 1
            last_client = who
        last_at = at
        cmd = rest[1:].split('"', 1)[0].lower()
        out[side][cmd] = out[side].get(cmd, 0) + 1
    return out


def per(calls: Mapping[str, int], n: int) -> dict[str, float]:
    return {name: round(v / n, 3) for name, v in calls.items()}


def report(r: dict[str, Any], cond: Mapping[str, str]) -> None:
    a, m = r["acked_push"], r["monitor_sample"]
    print(f"redis cost  commit={cond['commit']}  {cond['date']}  nproc={cond['nproc']}")
    print(
        f"  {r['pushes']} pushes to one online user at {r['rate']:g}/s, acked in"
        f" {r['ack_frames']} frames (at most one per {r['ack_interval_ms']} ms)"
    )
    print(f"  {'commands per push':<28}{a['commands']:>8.2f}")
    print(f"  {'script calls per push':<28}{a['script_calls']:>8.2f}")
    print(f"  {'round trips (reads) per push':<28}{a['round_trips']:>8.2f}")
    for name, v in a["calls"].items():
        print(f"    {name:<26}{v:>8.2f}")
    print(
        f"  MONITOR, {m['pushes']} more pushes (background included), per push:"
        f" {m['round_trips']:g} round trips; commands from clients / inside scripts"
    )
    for side in ("client", "script"):
        print(f"    {side:<8}" + "  ".join(f"{c} {v:g}" for c, v in m[side].items()))
    o = r["offline_push"]
    print(
        f"  offline push: {o['commands']:.2f} commands, {o['script_calls']:.2f} script calls,"
        f" {o['round_trips']:.2f} round trips"
    )
    print("    " + "  ".join(f"{c} {v:g}" for c, v in o["calls"].items() if abs(v) >= 0.01))
    print(f"  {'bytes per acked message':<28}{r['bytes_per_acked_message']:>8.1f}")
    print(
        f"  {'bytes per offline message':<28}{r['bytes_per_offline_message']:>8.1f}"
        f"  ({r['offline_users']} users, {PER_OFFLINE_USER} each)"
    )
    for title, key in (("acked", "memory_acked"), ("offline", "memory_offline")):
        fams = "  ".join(f"{f} {v['bytes'] / r['pushes']:.1f}" for f, v in r[key].items())
        print(f"    per message, {title}: {fams}")
