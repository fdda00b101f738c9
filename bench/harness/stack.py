"""One benchmark run: Redis (external or embedded), a key prefix of its own, and the
stack of child processes (router.processes.supervisor), stopped by PID whatever happens."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeVar

import redis

from bench.harness.report import conditions
from router.processes.devstack import gateway_argv, listed_gateways, push_service_argv
from router.processes.embedded_redis import EmbeddedRedis, redis_answers
from router.processes.ports import HOST, free_port
from router.processes.supervisor import Child, ChildExited, Supervisor
from router.routes.registry import decode_route
from shared.keys import KeySchema

__all__ = [
    "HOST",
    "BenchError",
    "BenchStack",
    "Harness",
    "Interrupted",
    "Service",
    "bench_argv",
    "clean_up",
    "drop_prefix",
    "loop_name",
    "raise_nofile",
    "run_async",
    "run_loop",
    "run_main",
    "start_service",
    "start_stack",
]

T = TypeVar("T")
READY_TIMEOUT_S = 30.0


class BenchError(Exception):
    """The benchmark could not run; the message says why."""


class Interrupted(Exception):
    """SIGINT (Ctrl-C) or SIGTERM arrived."""


class BenchStack(Supervisor):
    """The children of one run, each logging to a file of its own in `log_dir`."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        super().__init__(env)
        self.log_dir = log_dir
        self._logs: list[IO[bytes]] = []

    def spawn(self, name: str, argv: Sequence[str], *, pipes: bool = False) -> Child:
        """`pipes`: JSON lines on stdin and stdout (see bench.harness.link)."""
        log = (self.log_dir / f"{name}.log").open("wb")
        self._logs.append(log)
        # Own session: a terminal Ctrl-C reaches only us, and we stop the children.
        return self.start(
            name,
            argv,
            stdin="pipe" if pipes else "null",
            stdout="pipe" if pipes else log,
            stderr=log,
            new_session=True,
        )

    def pid(self, name: str) -> int:
        return self.child(name).pid

    def check(self) -> None:
        try:
            super().check()
        except ChildExited as exc:
            child = exc.child
            raise BenchError(
                f"{child.name} (pid {child.pid}) exited with code {child.returncode}"
            ) from None

    def stop_named(self, name: str) -> None:
        """SIGTERM one child by its PID, SIGKILL it after 10 s; forget it."""
        with contextlib.suppress(StopIteration):
            self.stop(self.child(name))

    def stop_all(self, sig: int = signal.SIGINT, grace_s: float = 10.0) -> None:
        """SIGINT by default, as `imroute dev` does: stop now. On SIGTERM a gateway that
        still holds clients drains them over IMROUTE_DRAIN_WINDOW_S (10 s)."""
        super().stop_all(sig, grace_s)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def tails(self, lines: int = 15) -> str:
        out = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                out.append(f"--- {path.name} (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(out)


def bench_argv(module: str, *args: str) -> list[str]:
    """A child process running a benchmark module (`bench.p2p --worker ...`); it inherits
    our working directory and environment, so `bench` resolves as it did for us."""
    return [sys.executable, "-m", module, *args]


def start_stack(
    stack: BenchStack, http_port: int, gateways: list[tuple[str, str, int, int]], api_key: str
) -> None:
    """The push service and (gateway_id, group, ws_port, grpc_port) gateways, until the
    push service lists every gateway as live."""
    stack.spawn("push-service", push_service_argv(HOST, http_port))
    for gid, group, ws_port, grpc_port in gateways:
        stack.spawn(gid, gateway_argv(gid, group, HOST, ws_port, grpc_port))
    wanted = {gid for gid, *_ in gateways}
    ready = stack.wait_until(
        lambda: listed_gateways(HOST, http_port, api_key, wanted), READY_TIMEOUT_S, interval_s=0.1
    )
    if ready is None:
        raise BenchError(f"the stack was not ready within {READY_TIMEOUT_S:.0f}s")


@dataclass(frozen=True)
class Service:
    """A running push service: its HTTP port, its API key and its (gateway_id, group,
    ws_port, grpc_port) gateways."""

    port: int
    api_key: str
    gateways: list[tuple[str, str, int, int]]

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def ws_urls(self) -> list[str]:
        return [f"ws://{HOST}:{ws}/ws" for _, _, ws, _ in self.gateways]


def start_service(h: Harness, groups: Sequence[str]) -> Service:
    """A fresh IMROUTE_API_KEY, the push service and gateways gw1, gw2, ... (one per entry of
    `groups`, in that group) on free ports, started as in start_stack."""
    api_key = secrets.token_urlsafe(24)
    h.env["IMROUTE_API_KEY"] = api_key
    port = free_port()
    gateways = [(f"gw{i + 1}", g, free_port(), free_port()) for i, g in enumerate(groups)]
    start_stack(h.stack, port, gateways, api_key)
    return Service(port, api_key, gateways)


def raise_nofile(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards `wanted` (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_loop(coro: Coroutine[Any, Any, T], loop: str | None = None) -> T:
    """asyncio.run, on uvloop when it is installed (as the push service runs under uvicorn),
    or on the loop named."""
    if (loop or loop_name()) == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _set_signals(handler: Callable[[int, FrameType | None], Any] | int) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def run_async(
    make: Callable[[], Coroutine[Any, Any, T]], timeout_s: float, loop: str | None = None
) -> T:
    """Run the async part (on `loop`, see run_loop); SIGINT/SIGTERM cancel it (-> Interrupted),
    and so does a timeout (-> BenchError)."""

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        got: list[int] = []

        def stop(sig: int) -> None:
            got.append(sig)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop, sig)
        try:
            return await asyncio.wait_for(make(), timeout_s)
        except asyncio.CancelledError:
            if got:
                raise Interrupted(signal.Signals(got[0]).name) from None
            raise
        except TimeoutError:
            raise BenchError(f"the run took over {timeout_s:.0f}s") from None
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    try:
        return run_loop(guarded(), loop)
    finally:
        _set_signals(_interrupt)


@dataclass
class Harness:
    """What every benchmark run sets up and tears down: Redis, a key prefix, the children."""

    tag: str
    env: dict[str, str]
    stack: BenchStack
    prefix: str
    redis_url: str = ""
    redis_pid: int | None = None
    embedded: EmbeddedRedis | None = None
    cond: dict[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> KeySchema:
        return KeySchema(self.prefix)

    def cpu_pids(self) -> dict[str, int]:
        """The processes whose CPU a run reports: every child by name, this one as
        "loadgen", and Redis when it runs on this machine."""
        pids = {c.name: c.pid for c in self.stack.children} | {"loadgen": os.getpid()}
        if self.redis_pid:
            pids["redis"] = self.redis_pid
        return pids

    async def wait_routes(self, uids: Sequence[str]) -> dict[str, str]:
        """uid -> its gateway, from Redis, once every uid has one route (30 s at most): a
        client's handshake ends before its register."""
        import redis.asyncio as aioredis

        client = aioredis.from_url(self.redis_url, decode_responses=True)
        try:
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                pipe = client.pipeline(transaction=False)
                for uid in uids:
                    pipe.hgetall(self.keys.route(uid))
                where: dict[str, str] = {}
                for uid, fields in zip(uids, await pipe.execute(), strict=True):
                    routes = [decode_route(uid, c, v) for c, v in fields.items()]
                    gateways = {r.gateway_id for r in routes if r is not None}
                    if len(gateways) == 1:
                        where[uid] = gateways.pop()
                if len(where) == len(uids):
                    return where
                if asyncio.get_running_loop().time() > deadline:
                    raise BenchError(
                        f"{len(uids) - len(where)} uids have no single route after 30s"
                    )
                await asyncio.sleep(0.1)
        finally:
            await client.aclose()


def run_main(tag: str, body: Callable[[Harness], None], nofile: int = 0) -> int:
    """Run `body` with a harness; stop every child by PID whatever happens. `nofile`: the
    file descriptors this process and its children (who inherit the limit) need."""
    if nofile:
        raise_nofile(nofile)
    _set_signals(_interrupt)
    log_dir = Path(tempfile.mkdtemp(prefix=f"imroute-bench-{tag}-"))
    env = dict(os.environ)
    h = Harness(tag, env, BenchStack(env, log_dir), prefix=f"bench:{secrets.token_hex(4)}:")
    h.cond = conditions(loop_name())
    keep_logs = True
    try:
        h.redis_url = os.environ.get("IMROUTE_REDIS_URL", "redis://127.0.0.1:6379/0")
        if redis_answers(h.redis_url):
            h.cond["redis"] = f"{h.redis_url} (external)"
        else:
            h.embedded = EmbeddedRedis()
            h.redis_url = h.embedded.start()
            h.cond["redis"] = f"embedded redis-server at {h.redis_url}"
        h.redis_pid = _local_redis_pid(h.redis_url, h.embedded)
        env.update(
            IMROUTE_REDIS_URL=h.redis_url,
            IMROUTE_REDIS_PREFIX=h.prefix,
            IMROUTE_SECRET=secrets.token_urlsafe(32),
            IMROUTE_LOG_LEVEL="warning",
            # Every bench client connects from the one loopback address: its handshakes
            # in flight (a resume storm's 1000) are capped by the pool alone.
            IMROUTE_WS_MAX_PRE_AUTH_PER_IP="1000",
        )
        body(h)
        keep_logs = False
        return 0
    except Interrupted as exc:
        print(f"{tag} bench: interrupted by {exc}; stopping the children", file=sys.stderr)
        keep_logs = False
        return 130
    except BenchError as exc:
        print(f"{tag} bench: {exc}", file=sys.stderr)
        print(h.stack.tails(), file=sys.stderr)
        return 1
    finally:
        _set_signals(signal.SIG_IGN)  # the clean-up below is bounded: let it finish
        h.stack.stop_all()
        if h.redis_url:
            with contextlib.suppress(redis.RedisError, OSError, ValueError):
                drop_prefix(h.redis_url, h.prefix)
        if h.embedded is not None:
            h.embedded.stop()
        if keep_logs:
            print(f"{tag} bench: the children's logs are in {log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
        _set_signals(signal.SIG_DFL)


def _local_redis_pid(url: str, embedded: EmbeddedRedis | None) -> int | None:
    """The redis-server's PID when it runs on this machine, for CPU accounting."""
    if embedded is not None:
        return embedded.pid
    with contextlib.suppress(redis.RedisError, OSError, KeyError, ValueError):
        client = redis.Redis.from_url(url, socket_timeout=1)
        try:
            pid = int(client.info("server")["process_id"])
        finally:
            client.close()
        if Path(f"/proc/{pid}/comm").read_text().strip().startswith("redis"):
            return pid
    return None


def clean_up(h: Harness, also: str = "") -> None:
    """Delete this run's keys now, saying how many and how long it took."""
    started = time.perf_counter()
    deleted = drop_prefix(h.redis_url, h.prefix)
    print(
        f"clean-up: deleted {deleted:,} keys under {h.prefix!r}{also} in"
        f" {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )


def drop_prefix(url: str, prefix: str) -> int:
    """Delete every key under `prefix` (SCAN + UNLINK, 1000 at a time); returns how many."""
    client = redis.Redis.from_url(url, socket_timeout=30)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=5000):
            batch.append(key)
            if len(batch) == 1000:
                deleted += int(client.unlink(*batch))
                batch.clear()
        if batch:
            deleted += int(client.unlink(*batch))
    finally:
        client.close()
    return deleted
