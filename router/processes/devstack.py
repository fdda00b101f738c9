"""`imroute dev`: the whole stack on one machine as child processes, stopped together.

A gateway or the push service that dies is restarted after RESTART_FIRST_S, doubling up
to RESTART_MAX_S while it keeps dying (as compose's `restart:` or a Kubernetes Deployment
would), and the rest of the stack keeps running. A drained gateway that exits 0 is done.
SIGINT (Ctrl-C), SIGTERM or SIGHUP (its terminal closed) stops it all: every child, then
the embedded Redis, its folder removed; dev exits 0.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import FrameType

from router.bus.factory import CLUSTER_SCHEME, check_bus_settings, hedging_from_settings
from router.directory.migrate import upgrade_sync
from router.processes.embedded_redis import EmbeddedRedis, keeps_nothing, redis_answers
from router.processes.ports import port_free
from router.processes.supervisor import ChildExited, Supervisor
from shared.backoff import backoff_s
from shared.errors import ConfigError
from shared.logs import say
from shared.settings import Settings, check_tracing, redact_url

__all__ = [
    "DevOptions",
    "DevStack",
    "gateway_argv",
    "listed_gateways",
    "push_service_argv",
    "stop_grace_s",
]

RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
# A child that stayed up this long starts its backoff over when it dies.
STABLE_S = 30.0
# Added to the deliver timeout and the jobs' grace for the children's stop: above the
# 17 s of a push request's longest wait (and a second) and the push service's own 5-s
# margin (`push_service.workers.stop_grace_s`).
STOP_MARGIN_S = 25.0
# What stops the stack, each alike: its children stopped, the embedded Redis too, exit 0.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class DevOptions:
    gateways: int = 2
    groups: int = 2
    port: int = 8080
    host: str = "127.0.0.1"


@dataclass
class _Managed:
    """What it takes to start a child again, and when."""

    argv: list[str]
    env: dict[str, str]
    started: float = 0.0  # monotonic
    deaths: int = 0  # in a row, each within STABLE_S of its start
    due: float | None = None  # when a dead one starts again


@dataclass
class DevStack:
    options: DevOptions
    environ: Mapping[str, str]
    children: Supervisor = field(default_factory=Supervisor)
    redis: EmbeddedRedis | None = None
    _stopping: bool = False
    _managed: dict[str, _Managed] = field(default_factory=dict)
    _log_format: str = "text"
    _stop_grace_s: float = 10.0

    def ports(self) -> list[tuple[str, int, int, str]]:
        """(gateway_id, ws_port, grpc_port, group_id) for each gateway."""
        o = self.options
        return [
            (f"gw{i}", o.port + i, o.port + 1000 + i, f"g{(i - 1) % o.groups + 1}")
            for i in range(1, o.gateways + 1)
        ]

    def run(self) -> int:
        settings = Settings.load(self.environ)
        # What every child checks at its start, checked here: a bad setting is exit 2
        # naming it, before anything starts (a child's exit 2 made dev's exit 1).
        check_bus_settings(settings)
        hedging_from_settings(settings)
        check_tracing(settings)
        self._log_format = settings.log_format
        self._stop_grace_s = stop_grace_s(settings.deliver_timeout_s, settings.job_shutdown_grace_s)
        self._check_ports()
        env = dict(self.environ)
        shown: dict[str, str] = {}
        if settings.api_key is None:
            env["IMROUTE_API_KEY"] = shown["api key"] = secrets.token_urlsafe(24)
        if settings.secret is None:
            env["IMROUTE_SECRET"] = shown["secret"] = secrets.token_urlsafe(32)
        if settings.admin_api_key is None and "api key" in shown:
            # With a generated API key, an admin key of its own (drains, directory writes);
            # with the caller's own API key and no admin key, that key keeps both roles.
            env["IMROUTE_ADMIN_API_KEY"] = shown["admin key"] = secrets.token_urlsafe(24)
        if settings.internal_token is None:
            # Only the children need it (the push service's credential on the gateways'
            # gRPC ports), so it is not shown.
            env["IMROUTE_INTERNAL_TOKEN"] = secrets.token_urlsafe(32)
        o = self.options

        # Handlers first: a Ctrl-C at any point from here on stops what was started. SIGHUP
        # (its terminal closed) too: by default it ended dev at once, and the embedded
        # Redis's folder stayed behind.
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        try:
            redis_url = self._redis(settings.redis_url)
            env["IMROUTE_REDIS_URL"] = redis_url
            if self.redis is None:
                # Said, as an embedded one is: the stack's keys go into that Redis.
                self._say(f"Redis: {redact_url(redis_url)} ({self._redis_origin(redis_url)})")
            if "IMROUTE_DB_URL" not in env:
                # The dev directory lives beside the working directory, kept across runs.
                state = os.path.abspath(".imroute")
                os.makedirs(state, exist_ok=True)
                env["IMROUTE_DB_URL"] = f"sqlite+aiosqlite:///{state}/users.db"
            upgrade_sync(env["IMROUTE_DB_URL"])
            self._say(f"user directory: {redact_url(env['IMROUTE_DB_URL'])} (migrated)")
            self._say(f"bus: {_bus_description(settings.bus_url, env)}")
            if self._stopping:
                return 0
            self._start("push-service", push_service_argv(o.host, o.port), env)
            for gid, ws, grpc, group in self.ports():
                self._start(gid, gateway_argv(gid, group, o.host, ws, grpc), env)
            gateways = self._wait_ready(env["IMROUTE_API_KEY"])
            if gateways is None:  # stopped by a signal while starting
                return 0
            self._banner(env, shown, gateways)
            return self._watch()
        finally:
            self.stop()

    def _check_ports(self) -> None:
        o = self.options
        if not 1 <= o.gateways <= 64 or not 1 <= o.groups <= o.gateways:
            raise ConfigError("--gateways must be 1-64 and --groups 1..gateways")
        ports = [("--port", o.port)] + [
            (f"{gid} ports", p) for gid, ws, grpc, _ in self.ports() for p in (ws, grpc)
        ]
        for name, port in ports:
            if not 1 <= port <= 65535:
                raise ConfigError(
                    f"--port {o.port}: {name} would be {port}, outside 1-65535 "
                    f"(gateway i uses PORT+i and PORT+1000+i)"
                )
            if not port_free(port, o.host):
                raise ConfigError(f"{name}: port {port} on {o.host} is already in use")

    def _wait_ready(self, api_key: str, timeout_s: float = 30.0) -> list[dict[str, object]] | None:
        o = self.options
        mine = {gid for gid, *_ in self.ports()}
        gateways = self.children.wait_until(
            lambda: listed_gateways(o.host, o.port, api_key, mine),
            timeout_s,
            cancelled=lambda: self._stopping,
        )
        if gateways is not None or self._stopping:
            return gateways
        raise RuntimeError(f"the stack did not become ready within {timeout_s:.0f}s")

    def _banner(
        self, env: Mapping[str, str], shown: Mapping[str, str], gateways: list[dict[str, object]]
    ) -> None:
        o = self.options
        key = env["IMROUTE_API_KEY"] if "api key" in shown else "$IMROUTE_API_KEY"
        secret = env["IMROUTE_SECRET"] if "secret" in shown else "$IMROUTE_SECRET"
        if "admin key" in shown:
            admin, admin_from = env["IMROUTE_ADMIN_API_KEY"], ""
        elif "IMROUTE_ADMIN_API_KEY" in env:
            admin, admin_from = "$IMROUTE_ADMIN_API_KEY", "   (from IMROUTE_ADMIN_API_KEY)"
        else:
            admin, admin_from = key, "   (none set: the API key holds the admin role)"
        lines = [
            "",
            "imroute dev is up.",
            f"  API:       http://{o.host}:{o.port}   (docs: http://{o.host}:{o.port}/docs)",
            f"  Redis:     {redact_url(env['IMROUTE_REDIS_URL'])}   "
            f"({self._redis_origin(env['IMROUTE_REDIS_URL'])})",
            f"  API key:   {key}" + ("" if "api key" in shown else "   (from IMROUTE_API_KEY)"),
            f"  admin key: {admin}{admin_from}   (drains, user directory writes)",
            f"  secret:    {secret}" + ("" if "secret" in shown else "   (from IMROUTE_SECRET)"),
            "  gateways:",
            *(
                f"    {g['gateway_id']} group={g['group_id']} ws={g['ws_url']} "
                f"grpc={g['grpc_address']}"
                for g in gateways
            ),
            "  try it:",
            f"    TOKEN=$(IMROUTE_SECRET={secret} {_imroute()} token alice)",
            f'    {sys.executable} -m websockets "{gateways[0]["ws_url"]}?token=$TOKEN"',
            f"    curl -s -H \"Authorization: Bearer {key}\" -H 'Content-Type: application/json' "
            f'-d \'{{"to":["alice"],"content":{{"text":"hi"}}}}\' '
            f"http://{o.host}:{o.port}/v1/push",
            f'    curl -s -X PUT -H "Authorization: Bearer {admin}" -H \'Content-Type: '
            f'application/json\' -d \'{{"users":[{{"uid":"alice","tags":["vip"]}}]}}\' '
            f"http://{o.host}:{o.port}/v1/users",
            f"    curl -s -H \"Authorization: Bearer {key}\" -H 'Content-Type: application/json' "
            f'-d \'{{"content":{{"text":"to all"}}}}\' http://{o.host}:{o.port}/v1/broadcast',
            "  Ctrl-C stops everything.",
            "",
        ]
        print("\n".join(lines), flush=True)

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self._managed[name] = _Managed(argv, env)
        self._restart(name)

    def _restart(self, name: str) -> None:
        managed = self._managed[name]
        managed.started, managed.due = time.monotonic(), None
        # A session of its own: a terminal's Ctrl-C reaches only dev, which passes it on
        # once. A second SIGINT makes uvicorn exit at once, skipping its lifespan's
        # shutdown (the jobs' hand-over).
        self.children.start(name, managed.argv, env=managed.env, new_session=True)

    def _watch(self) -> int:
        while not self._stopping:
            self._check_children()
            self._restart_due()
            time.sleep(0.2)
        return 0

    def _check_children(self) -> None:
        for child in self.children.exited():
            if self._stopping:
                return
            self.children.forget(child)
            if child.returncode == 0 and child.name != "push-service":
                # A gateway that was drained (POST /v1/gateways/{id}/drain) exits
                # cleanly once its clients moved: the rest of the stack goes on.
                self._say(f"imroute dev: {child.name} drained and exited")
                continue
            managed, now = self._managed[child.name], time.monotonic()
            if now - managed.started >= STABLE_S:
                managed.deaths = 0  # it had been up a while: start over
            managed.deaths += 1
            delay = backoff_s(managed.deaths, RESTART_FIRST_S, RESTART_MAX_S, rand=None)
            managed.due = now + delay
            self._say(f"imroute dev: {ChildExited(child)}; restarting it in {delay:.0f}s", err=True)

    def _redis(self, redis_url: str) -> str:
        """The Redis the children use: the one at `redis_url`, or an embedded one
        started here when none answers there (warned about when it keeps nothing)."""
        if redis_url.startswith(CLUSTER_SCHEME + "://"):
            return redis_url  # used as it is: one embedded server cannot stand in for it
        if not redis_answers(redis_url):
            self.redis = EmbeddedRedis()
            started = self.redis.start()
            self._say(
                f"no Redis at {redact_url(redis_url)}: started an embedded one "
                f"at {started} (append-only file on, as imroute asks of any Redis)"
            )
            return started
        if keeps_nothing(redis_url):
            self._say(
                f"warning: the Redis at {redact_url(redis_url)} keeps nothing on disk "
                "(appendonly no): a restart of it loses offline users' inboxes and the "
                "recovery window (connected clients lose nothing; resumes say complete: "
                "false). Run it with --appendonly yes --appendfsync everysec "
                "(docs/operations/guarantees.md)",
                err=True,
            )
        return redis_url

    def _redis_origin(self, url: str) -> str:
        """Whose the Redis at `url` is, the one `_redis` chose for the children."""
        if self.redis is not None:
            return "embedded: stopped and removed with dev"
        if url.startswith(CLUSTER_SCHEME + "://"):
            return "a cluster, used as given: dev writes its keys there"
        return "already running: dev writes its keys there and leaves it running"

    def _restart_due(self) -> None:
        now = time.monotonic()
        for name, managed in self._managed.items():
            if managed.due is not None and managed.due <= now and not self._stopping:
                self._restart(name)
                self._say(f"imroute dev: {name} restarted", err=True)

    def _say(self, text: str, err: bool = False) -> None:
        """One of this supervisor's own lines, timed like its children's (the banner,
        for people to read and copy from, is printed as it is)."""
        level = logging.WARNING if err else logging.INFO
        say(text, self._log_format, "dev", err=err, level=level)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def stop(self) -> None:
        """SIGINT every child (stop now: a gateway would drain on SIGTERM), wait, SIGKILL
        stragglers, then stop the embedded Redis."""
        self._stopping = True
        self.children.stop_all(signal.SIGINT, grace_s=self._stop_grace_s)
        if self.redis is not None:
            self.redis.stop()
            self.redis = None


def stop_grace_s(deliver_timeout_s: float, job_shutdown_grace_s: float) -> float:
    """How long the children get to stop: longer than the push service gives its own
    workers (`push_service.workers.stop_grace_s`: its open requests' grace, the deliver
    timeout plus 16 s, then its jobs'), so it is never killed before it killed them (a
    killed push service left a worker holding its port). Stopping children seldom take
    more than a second."""
    return deliver_timeout_s + STOP_MARGIN_S + job_shutdown_grace_s


def push_service_argv(host: str, port: int) -> list[str]:
    """The push service as a child process (uvicorn, one worker)."""
    return [sys.executable, "-m", "push_service", "--host", host, "--port", str(port)]


def gateway_argv(gateway_id: str, group: str, host: str, ws_port: int, grpc_port: int) -> list[str]:
    """A socket gateway as a child process."""
    return [
        sys.executable,
        "-m",
        "socket_gateway",
        *("--id", gateway_id, "--group", group),
        *("--ws-host", host, "--ws-port", str(ws_port)),
        *("--grpc-host", host, "--grpc-port", str(grpc_port)),
    ]


def listed_gateways(
    host: str, port: int, api_key: str, wanted: Collection[str]
) -> list[dict[str, object]] | None:
    """The `wanted` gateways as GET /v1/gateways lists them; None until it lists them all."""
    request = urllib.request.Request(
        f"http://{host}:{port}/v1/gateways", headers={"Authorization": f"Bearer {api_key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=1) as resp:
            gateways: list[dict[str, object]] = json.load(resp)["gateways"]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return None
    if not set(wanted) <= {str(g["gateway_id"]) for g in gateways}:
        return None
    return [g for g in gateways if g["gateway_id"] in wanted]


def _imroute() -> str:
    candidate = os.path.join(os.path.dirname(sys.executable), "imroute")
    return candidate if os.path.exists(candidate) else "imroute"


def _bus_description(bus_url: str | None, env: dict[str, str]) -> str:
    """Which bus the stack's processes will use, for the start-up banner."""
    if bus_url is None:
        return "Redis Streams on IMROUTE_REDIS_URL"
    if bus_url.startswith("pubsub://"):
        emulator = env.get("PUBSUB_EMULATOR_HOST")
        where = f"the emulator at {emulator}" if emulator else "Google Cloud"
        return f"Google Cloud Pub/Sub, {bus_url} on {where}"
    return f"Redis Streams on {redact_url(bus_url)}"
