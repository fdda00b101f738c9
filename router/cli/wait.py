"""`--wait`: follow a broadcast or multicast job (GET /v1/pushes/{id}) to its end, with
a progress bar on standard error (batches published, then recipients delivered).

A push service that cannot be reached meanwhile (a restart, a deploy; behind a proxy, a
502, 503 or 504) does not end the follow: the job goes on without it, so the polls go on
until `--timeout`, the outage said once on standard error.

A job is done once its batches are published; what the gateways wrote comes after, in
their delivery reports (each flushed within 50 ms). So the end is read again, every
`POLL_S`, until two reads agree on what the gateways report (at most `SETTLE_S`): the
last line has what they had written by then, not only what they had reported by the
publish's end; a gateway slower to report than that is read as it stands. Acks go on
coming as users ack, and are not waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from router.cli.rest import RemoteError, RestClient

__all__ = ["JOB_FIELDS", "POLL_S", "SETTLE_S", "finished", "wait_for_job"]

POLL_S = 0.5
# How long a done job's counts are read again until two reads agree.
SETTLE_S = 5.0
# The counts the gateways' delivery reports move just after a job's end (not `acked`:
# acks come as users ack, for as long as they take).
REPORTED = ("online", "offline", "delivered", "queued")
# Answers of a proxy in front of a push service that is away (503: also one shedding).
AWAY_STATUSES = frozenset({502, 503, 504})
# What the progress bar and the last line read of a job
JOB_FIELDS = (
    "push_id",
    "mode",
    "status",
    "recipients",
    "online",
    "offline",
    "batches",
    "published",
    "delivered",
    "acked",
    "queued",
)


def finished(job: dict[str, Any]) -> bool:
    return job.get("status") in ("done", "failed")


def wait_for_job(
    api: RestClient,
    push_id: str,
    timeout_s: float,
    progress: bool,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """The job once it is done or failed, its reports in; RemoteError when it is still
    running after `timeout_s` (it goes on: the command only stops following it)."""
    deadline = clock() + timeout_s
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} batches"),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not progress,
    )
    with bar:
        task = bar.add_task(push_id, total=None, counts="")
        unreachable = False
        ended: dict[str, Any] | None = None  # the last read of the job once it was done
        settle_until = 0.0
        while True:
            try:
                job = api.call("GET", f"/v1/pushes/{push_id}", expect=JOB_FIELDS)
            except RemoteError as exc:
                if ended is not None:
                    return ended  # done: a later read that failed takes nothing from that
                away = exc.unreachable or exc.status in AWAY_STATUSES
                if not away or clock() >= deadline:
                    raise
                if not unreachable:
                    bar.console.print(f"{exc}; still following {push_id}", markup=False)
                unreachable = True
                sleep(POLL_S)
                continue
            if unreachable:
                bar.console.print(f"the push service answers again; following {push_id}")
                unreachable = False
            counts = f"{job['delivered']} delivered, {job['acked']} acked of {job['recipients']}"
            bar.update(
                task,
                # An ended job has all its batches; a running one may have none yet.
                total=job["batches"] if finished(job) else max(job["batches"], 1),
                completed=job["published"],
                counts=counts,
                description=f"{job['mode']} {job['status']}",
            )
            if finished(job):
                now = clock()
                if ended is None:
                    settle_until = min(now + SETTLE_S, deadline)
                elif all(job[k] == ended[k] for k in REPORTED) or now >= settle_until:
                    return job
                ended = job
            elif clock() >= deadline:
                raise RemoteError(
                    0, f"{push_id} still {job['status']} after {timeout_s:g} s (it goes on)", job
                )
            sleep(POLL_S)
