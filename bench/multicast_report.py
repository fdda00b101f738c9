"""The multicast bench's figures and checks: the Result of a run, the group streams read
back, the same multicast once through the HTTP API, and the printed report."""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.harness.counting import directory_uid, stream_entries
from bench.harness.report import MIB, machine_lines, mark, mib
from bench.harness.stack import HOST, BenchError, Harness
from bench.harness.stats import cpu_seconds, vm_kib
from router.fanout.publisher import group_topic
from router.processes.devstack import push_service_argv
from router.processes.ports import free_port
from router.routes.base import LOOKUP_CHUNK
from shared.keys import KeySchema
from shared.proto import gateway_pb2

__all__ = ["CONTENT", "GROUPS", "Result", "http_multicast", "report", "verify"]

GROUPS = 4
ROUTE_TTL_S = 900.0  # the routes must outlive the setup and the run; the keys expire anyway
TARGET_RATE = 250_000  # recipients/s
TARGET_RSS_MB = 300
ROUND_TRIP_SLACK = 8  # "a small constant" over ceil(N/1000) look-up round trips
TIMEOUT_S = 170.0  # each async phase; a whole run stays well under three minutes
CONTENT = b'{"text":"multicast bench"}'


def group_of(i: int, groups: int) -> str:
    return f"g{i % groups + 1}"


@dataclass
class Result:
    recipients: int
    groups: int
    seconds: float = 0.0  # start -> last publish done
    seconds_total: float = 0.0  # start -> run_multicast returned
    online: int = 0
    offline: int = 0
    lookups: int = 0
    lookup_round_trips: int = 0
    lookup_commands: int = 0
    lookup_s: float = 0.0
    lookup_read_s: float = 0.0
    lookahead: int = 0
    read_path: str = ""
    publishes: int = 0
    publish_s: float = 0.0
    publish_bytes: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)
    wire_writes: int = 0
    cpu_self_s: float = 0.0
    cpu_redis_s: float | None = None
    cpu_others_s: float = 0.0
    rss_idle_kib: int = 0
    rss_with_list_kib: int = 0
    rss_peak_kib: int = 0
    rss_sampled_peak_kib: int = 0
    rss_after_kib: int = 0
    hwm_reset: bool = False
    ru_maxrss_before_kib: int = 0
    ru_maxrss_after_kib: int = 0
    list_build_s: float = 0.0
    profile: str = ""


async def verify(url: str, prefix: str, n: int, groups: int) -> dict[str, int]:
    """Read the group streams back: every recipient exactly once, in its own group."""
    keys = KeySchema(prefix)
    seen = bytearray(n)
    per_group: dict[str, int] = {}
    problems = 0
    for g in range(groups):
        group = f"g{g + 1}"
        async for fields in stream_entries(url, keys.bus_stream(group_topic(group))):
            batch = gateway_pb2.Batch.FromString(fields[b"data"])
            if batch.group_id != group or batch.mode != gateway_pb2.MODE_MULTICAST:
                problems += 1
            for uid in batch.uids:
                i = int(uid[1:])
                if not 0 <= i < n or group_of(i, groups) != group or seen[i]:
                    problems += 1
                    continue
                seen[i] = 1
            per_group[group] = per_group.get(group, 0) + len(batch.uids)
    return {
        "published_uids": sum(per_group.values()),
        "missing": n - sum(seen),
        "problems": problems,
    }


# --------------------------------------------------------------------------- HTTP


def http_multicast(h: Harness, n: int, groups: int) -> dict[str, Any]:
    """Start a push service (stopped by PID with the harness), POST one multicast to all
    N recipients and wait for its job to finish."""
    api_key = secrets.token_urlsafe(24)
    port = free_port()
    h.env.update(
        IMROUTE_API_KEY=api_key,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{h.stack.log_dir / 'users.db'}",
    )
    proc = h.stack.spawn("push-service", push_service_argv(HOST, port))
    base = f"http://{HOST}:{port}"
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as http:
        deadline = time.monotonic() + 30
        while True:
            h.stack.check()
            with contextlib.suppress(httpx.HTTPError):
                if http.get("/healthz").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise BenchError("the push service did not answer /healthz within 30s")
            time.sleep(0.1)
        idle = vm_kib(proc.pid)
        body = json.dumps(
            {"to": [directory_uid(i) for i in range(n)], "content": json.loads(CONTENT)},
            separators=(",", ":"),
        ).encode()
        body_mib = len(body) / MIB
        cpu_before = cpu_seconds(proc.pid) or 0.0
        started = time.perf_counter()
        resp = http.post(
            "/v1/multicast", content=body, headers={"Content-Type": "application/json"}
        )
        accepted = time.perf_counter() - started
        if resp.status_code != 202:
            raise BenchError(f"POST /v1/multicast answered {resp.status_code}: {resp.text[:300]}")
        push_id = resp.json()["push_id"]
        del body
        job: dict[str, Any] = {}
        polls: list[float] = []  # how long the busy push service takes to answer a GET
        while time.perf_counter() - started < 150:
            asked = time.perf_counter()
            job = http.get(f"/v1/pushes/{push_id}").json()
            polls.append(time.perf_counter() - asked)
            if job.get("status") in ("done", "failed"):
                break
            time.sleep(0.02)
        done = time.perf_counter() - started
        cpu = (cpu_seconds(proc.pid) or 0.0) - cpu_before
        peak = vm_kib(proc.pid)
    if job.get("status") != "done":
        raise BenchError(f"multicast job did not finish: {job}")
    return {
        "accepted_s": accepted,
        "done_s": done,
        "job_s": (job["finished_at"] - job["created_at"]) / 1000,
        "job": job,
        "cpu_s": cpu,
        "rss_idle_kib": idle["VmRSS"],
        "rss_peak_kib": peak["VmHWM"],
        "body_mib": body_mib,
        "polls": len(polls),
        "poll_p50_ms": 1000 * statistics.median(polls),
        "poll_max_ms": 1000 * max(polls),
    }


# --------------------------------------------------------------------------- report


def report(
    r: Result,
    cond: Mapping[str, str],
    setup_s: float,
    check: Mapping[str, int],
    http: Mapping[str, Any] | None,
) -> dict[str, Any]:
    n, groups = r.recipients, r.groups
    chunks = math.ceil(n / LOOKUP_CHUNK)
    rate = n / r.seconds if r.seconds else math.inf
    round_trips = r.lookup_round_trips + r.publishes
    naive = 2 * n
    growth_total = mib(r.rss_peak_kib - r.rss_idle_kib)
    growth_run = mib(r.rss_peak_kib - r.rss_with_list_kib)
    lines = [
        "imroute group multicast benchmark (run_multicast -> BatchPublisher -> RedisStreamsBus)",
        "conditions:",
        *machine_lines(cond),
        f"  python      {cond['python']}  loop={cond['loop']}  redis-py {cond['redis']}"
        f"  hiredis {cond['hiredis']}  protobuf {cond['protobuf']}",
        f"  redis       {cond['redis_server']} (server {cond['redis_version']}), prefix"
        f" {cond['prefix']!r}; used memory {cond['redis_used_mib']} MiB before setup,"
        f" {cond['redis_loaded_mib']} MiB with the routes",
        f"  recipients  {n:,} online (uid u0000000.., 1 route each), {groups} groups with one"
        f" fake gateway each, uid i in group i % {groups}; registered in {setup_s:.1f}s"
        " (not timed)",
        f"  path        in-process; chunks of {LOOKUP_CHUNK} (one round trip of HVALS each,"
        f" through {r.read_path}), {r.lookahead} look-ups in flight, batch size 1000, flush"
        f" timeout 1 s, normal priority; bus maxlen"
        f" {cond['maxlen']}; {len(CONTENT)}-byte content",
        "results:",
        f"  time        {r.seconds:.2f}s start -> last publish ({r.seconds_total:.2f}s until"
        f" run_multicast returned)",
        f"  rate        {rate:,.0f} recipients/s   target >= {TARGET_RATE:,}:"
        f" {mark(rate >= TARGET_RATE)}",
        f"  counted     {r.online:,} online, {r.offline:,} offline",
        f"  publishes   {r.publishes:,} (per topic {r.per_topic}); ceil(N/1000) + groups ="
        f" {chunks + groups:,}: {mark(r.publishes <= chunks + groups)};"
        f" {r.publish_bytes / MIB:.1f} MiB of batches",
        f"  look-ups    {r.lookup_round_trips:,} round trips for {r.lookup_commands:,}"
        f" HVALS; ceil(N/1000) + {ROUND_TRIP_SLACK} = {chunks + ROUND_TRIP_SLACK:,}:"
        f" {mark(r.lookup_round_trips <= chunks + ROUND_TRIP_SLACK)}",
        f"  round trips {round_trips:,} = {r.lookup_round_trips:,} look-ups + {r.publishes:,}"
        f" XADDs (redis-py socket writes during the run: {r.wire_writes:,});"
        f" naive 2 calls per recipient: {naive:,} ({naive / max(round_trips, 1):,.0f}x more)",
        f"  where       look-up calls {r.lookup_s:.2f}s summed (of which route reads"
        f" {r.lookup_read_s:.2f}s; up to {r.lookahead} overlap, so the sum can exceed the wall"
        f" time), publishes {r.publish_s:.2f}s (XADD); --profile splits the CPU time",
        f"  cpu         this process {r.cpu_self_s:.2f}s"
        f" ({100 * r.cpu_self_s / max(r.seconds_total, 1e-9):.0f}% of a core), redis-server"
        + (
            f" {r.cpu_redis_s:.2f}s ({100 * r.cpu_redis_s / max(r.seconds_total, 1e-9):.0f}%)"
            if r.cpu_redis_s is not None
            else " n/a"
        )
        + f", other processes {r.cpu_others_s:.2f}s",
        f"  memory      RSS idle {mib(r.rss_idle_kib):.0f} MiB -> {mib(r.rss_with_list_kib):.0f}"
        f" MiB with the {n:,}-uid list (built in {r.list_build_s:.2f}s) -> peak"
        f" {mib(r.rss_peak_kib):.0f} MiB (VmHWM{'' if r.hwm_reset else ', NOT reset'};"
        f" sampled peak {mib(r.rss_sampled_peak_kib):.0f} MiB) -> {mib(r.rss_after_kib):.0f}"
        " MiB after",
        f"  peak growth {growth_total:.0f} MiB over idle incl. the list, {growth_run:.0f} MiB over"
        f" idle + list; target < {TARGET_RSS_MB} MB:"
        f" {mark(growth_total * MIB < TARGET_RSS_MB * 1e6)}",
        f"  ru_maxrss   {mib(r.ru_maxrss_before_kib):.0f} MiB before ->"
        f" {mib(r.ru_maxrss_after_kib):.0f} MiB after (process-lifetime peak;"
        " includes the setup phase)",
        f"  check       {check['published_uids']:,} uids read back from the group streams,"
        f" {check['missing']:,} missing, {check['problems']:,} wrong group/duplicate/other",
    ]
    if http is not None:
        job = http["job"]
        lines += [
            "HTTP API (POST /v1/multicast on a push service child process, uvicorn):",
            f"  body        {http['body_mib']:.1f} MiB JSON; 202 after {http['accepted_s']:.2f}s"
            " (upload, parse, validation)",
            f"  job         {job['status']}: {job['recipients']:,} recipients, {job['online']:,}"
            f" online, {job['published']:,} published; job ran {http['job_s']:.2f}s;"
            f" POST -> done seen {http['done_s']:.2f}s"
            f" ({n / max(http['done_s'], 1e-9):,.0f} recipients/s end to end)",
            f"  push svc    CPU {http['cpu_s']:.2f}s; RSS idle {mib(http['rss_idle_kib']):.0f} MiB,"
            f" peak {mib(http['rss_peak_kib']):.0f} MiB",
            f"  meanwhile   {http['polls']} GET /v1/pushes/<id> answered in median"
            f" {http['poll_p50_ms']:.1f} ms, max {http['poll_max_ms']:.1f} ms (the job shares"
            " the push service's event loop)",
        ]
    print("\n".join(lines), flush=True)
    if r.profile:
        print("\ncProfile of the measured run (sorted by own time, then cumulative):")
        print(r.profile, flush=True)
    return {
        "conditions": dict(cond),
        "setup_s": setup_s,
        "rate": rate,
        "round_trips": round_trips,
        "naive_calls": naive,
        "check": dict(check),
        "http": {k: v for k, v in (http or {}).items()},
        **{k: v for k, v in vars(r).items() if k != "profile"},
    }
