"""IMROUTE_WORKERS: several push-service processes behind one listening port.

One Python process tops out at one core, and the push service is what saturates first
(docs/operations/deployment.md, "Workers"). This process binds the port once and starts
`workers` children, each a whole push service (`python -m push_service` with the socket
inherited), which all accept on the one socket, as uvicorn's and gunicorn's workers do:
the kernel hands each connection to whichever worker accepts it first, so a busy one
takes fewer.

Everything a worker shares with the others lives in Redis already (jobs and their
leases, rate limits, idempotency keys, receipts, webhook outboxes, the fleet), as it
does between push-service processes on several hosts; what each keeps for itself (the
fleet cache, circuit breakers, gRPC channels) is a per-process view that each keeps
correct on its own. /metrics answers for all workers (push_service.worker).

The children are in their own session, so a terminal's Ctrl-C reaches this process
only, which passes it on once; they die with it if it is killed (PR_SET_PDEATHSIG). A
worker that exits once it has started is started again after a pause; one that exits
before it started (a bad setting, an unreachable Redis) stops them all with its code, as
one process would.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from push_service.http_server import requests_grace_s
from router.processes.supervisor import Child, Supervisor
from shared.logs import configure, say
from shared.settings import PushSettings

__all__ = ["BACKLOG", "serve_workers", "stop_grace_s", "worker_argv"]

log = logging.getLogger(__name__)

BACKLOG = 2048
RESTART_PAUSE_S = 1.0
# A worker crashing this often is not a fluke: stop everything, loudly.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def listen(host: str, port: int) -> socket.socket:
    """The one listening TCP socket, inheritable by the workers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def worker_argv(argv: Sequence[str], fd: int, index: int, folder: str) -> list[str]:
    """A worker's command line: ours, plus the socket, its number and the shared folder."""
    return [
        sys.executable, "-m", "push_service", *argv,
        "--listen-fd", str(fd), "--worker", str(index), "--workers-dir", folder,
    ]  # fmt: skip


class _Signals:
    """The first SIGINT or SIGTERM, to pass on to the workers."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.event = threading.Event()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        self.event.set()


def serve_workers(settings: PushSettings, argv: Sequence[str]) -> int:
    """Run `settings.workers` push services on one port until SIGINT or SIGTERM; the exit
    code is 0, or that of a worker that could not start."""
    configure(settings.log_level, settings.log_format, "push-service")
    try:
        sock = listen(settings.host, settings.port)
    except OSError as exc:
        _say(
            settings,
            f"imroute push-service: cannot listen on {settings.host}:{settings.port}: {exc}",
            err=True,
        )
        return 1
    signals = _Signals()
    signal.signal(signal.SIGINT, signals)
    signal.signal(signal.SIGTERM, signals)
    folder = tempfile.mkdtemp(prefix="imroute-workers-")
    port = int(sock.getsockname()[1])  # the one asked for, or the one picked for 0
    _say(
        settings,
        f"imroute push-service: starting {settings.workers} workers (IMROUTE_WORKERS) on "
        f"{settings.host}:{port}; supervisor pid {os.getpid()}",
        err=True,
    )
    try:
        with Supervisor() as sup:
            return _supervise(sup, settings, argv, sock.fileno(), port, folder, signals)
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


def _supervise(
    sup: Supervisor,
    settings: PushSettings,
    argv: Sequence[str],
    fd: int,
    port: int,
    folder: str,
    signals: _Signals,
) -> int:
    def start(index: int) -> Child:
        return sup.start(
            f"worker-{index}",
            worker_argv(argv, fd, index, folder),
            new_session=True,
            pass_fds=(fd,),
            # A stop sent while it starts is held until its server can handle it: a
            # replacement worker stopped during its start ran on, once in a while, until
            # the grace's SIGKILL (more than 30 s): its SIGINT landed, most likely,
            # where Python drops a KeyboardInterrupt.
            hold_stops=True,
        )

    # In uvicorn's words (its workers on an inherited socket say nothing), which is what
    # people and scripts wait for; said now, as the port takes connections from now on
    # (they wait in its backlog until a worker accepts them), and before any worker can
    # log what it does.
    _say(
        settings,
        f"INFO:     Uvicorn running on http://{_url_host(settings.host)}:{port} "
        f"with {settings.workers} workers (Press CTRL+C to quit)",
        err=False,
    )
    workers = {i: start(i) for i in range(settings.workers)}
    restarts: list[float] = []
    code = 0
    while not signals.event.wait(0.2):
        for index, child in list(workers.items()):
            exit_code = child.poll()
            if exit_code is None:
                continue
            sup.forget(child)
            now = time.monotonic()
            if not (Path(folder) / f"{index}.ready").exists():
                # It never started (a bad setting, Redis refusing, a lifespan error): it
                # said why on stderr, and the others would say the same.
                code = exit_code or 1
                signals.event.set()
                break
            restarts = [t for t in restarts if now - t < RESTART_WINDOW_S] + [now]
            if len(restarts) > MAX_RESTARTS:
                log.error(
                    "push-service workers exited %d times within %.0f s; stopping",
                    len(restarts),
                    RESTART_WINDOW_S,
                )
                _say(
                    settings,
                    f"imroute push-service: workers keep exiting (the last with code "
                    f"{exit_code}); stopping",
                    err=True,
                )
                code = 1
                signals.event.set()
                break
            _say(
                settings,
                f"imroute push-service: worker {index} (pid {child.pid}) exited with code "
                f"{exit_code}; starting it again in {RESTART_PAUSE_S:g} s",
                err=True,
            )
            time.sleep(RESTART_PAUSE_S)
            workers[index] = start(index)
    sig = signals.received or signal.SIGTERM
    # A worker finishes its requests and its jobs' shutdown grace, then stops.
    sup.stop_all(sig, grace_s=stop_grace_s(settings))
    return code


def stop_grace_s(settings: PushSettings) -> float:
    """How long the workers get to stop before they are killed: their open requests'
    grace (`requests_grace_s`), then their jobs' (IMROUTE_JOB_SHUTDOWN_GRACE_S)."""
    return requests_grace_s(settings) + settings.job_shutdown_grace_s + 5.0


def _say(settings: PushSettings, text: str, err: bool) -> None:
    """What the supervisor tells people and scripts, whatever IMROUTE_LOG_LEVEL."""
    level = logging.INFO if text.startswith("INFO:") else logging.WARNING
    if settings.log_format == "json":
        text = text.removeprefix("INFO:").strip()
    say(text, settings.log_format, "push-service", err=err, level=level)
