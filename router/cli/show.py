"""What the operator commands print: a line or a table for people, the answer's JSON
with `--json` (on standard output), errors on standard error."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["error", "fleet_table", "job_line", "out", "push_lines"]


def out(answer: dict[str, Any], as_json: bool, human: str | Table) -> None:
    if as_json:
        print(json.dumps(answer, indent=2, sort_keys=True))
    elif isinstance(human, Table):
        Console(soft_wrap=True).print(human)
    else:
        print(human)


def error(command: str, message: str) -> None:
    print(f"imroute {command}: {message}", file=sys.stderr)


def _names(uids: Sequence[str], most: int = 10) -> str:
    shown = ", ".join(uids[:most])
    return f" ({shown}{', ...' if len(uids) > most else ''})" if uids else ""


def push_lines(answer: dict[str, Any]) -> str:
    """`push <id>: delivered 1 (amy), offline 0, queued 1 (bob), failed 0`, and the
    errors and acks when there are some."""
    parts = [
        f"{key} {len(answer.get(key) or [])}{_names(answer.get(key) or [])}"
        for key in ("delivered", "offline", "queued", "failed")
    ]
    lines = [f"push {answer.get('push_id')}: " + ", ".join(parts)]
    if answer.get("acked") is not None:
        acked, unacked = answer["acked"], answer.get("unacked") or []
        lines.append(f"acked {len(acked)}{_names(acked)}, unacked {len(unacked)}{_names(unacked)}")
    lines += [
        f"  {e.get('gateway_id')}: {e.get('error')}"
        for e in answer.get("errors") or []
        if isinstance(e, dict)
    ]
    return "\n".join(lines)


def job_line(job: dict[str, Any]) -> str:
    """`multicast <id> done: 3 recipients (2 online, 1 offline), 2 batches published ...`."""
    text = (
        f"{job['mode']} {job['push_id']} {job['status']}: {job['recipients']} recipients "
        f"({job['online']} online, {job['offline']} offline), {job['published']}/"
        f"{job['batches']} batches published, {job['delivered']} delivered, "
        f"{job['acked']} acked, {job['queued']} queued"
    )
    if job.get("failed_batches"):
        text += f"; {job['failed_batches']} batches failed"
    if job.get("error"):
        text += f"; error: {job['error']}"
    return text


def fleet_table(gateways: list[dict[str, Any]]) -> Table | str:
    """The live gateways, by group then id, with each group's share of the connections."""
    if not gateways:
        return "no live gateway"
    total = sum(g["connections"] for g in gateways) or 1
    table = Table("group", "gateway", "state", "connections", "share", "zone", "ws_url")
    for g in sorted(gateways, key=lambda g: (g["group_id"], g["gateway_id"])):
        most = g.get("max_connections") or 0
        connections = f"{g['connections']}/{most}" if most else str(g["connections"])
        table.add_row(
            g["group_id"],
            g["gateway_id"],
            "draining" if g.get("draining") else "live",
            connections,
            f"{100 * g['connections'] / total:.0f}%",
            g.get("zone") or "",
            g["ws_url"],
        )
    return table
