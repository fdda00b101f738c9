"""N WebSocket clients that behave like real ones: each asks `GET /v1/dispatch` where to
connect, connects there, counts the pushes it gets, and when its gateway drains (a
`reconnect` frame, then close 4503) or is full (4429), asks dispatch again and moves.

Every `--every` seconds it prints how the clients spread over the gateways:

    IMROUTE_SECRET=<secret> .venv/bin/python examples/clients.py --count 1000
    t=12.6s connected=1000/1000 gw1=262 gw2=247 gw3=253 gw4=238 moves=0 pushes=0

Drain a gateway meanwhile (`POST /v1/gateways/gw1/drain` with the API key) and watch
its clients move: a client told to go asks dispatch again at once; one refused (4429
full, 1013 try again) or cut off backs off with jitter first. `--json` prints the
same as JSON lines; `--duration` stops after that many seconds (else Ctrl-C). Tokens
are minted with IMROUTE_SECRET, the stack's client secret (`imroute dev` prints it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from shared.auth import issue_token
from shared.clock import SystemClock

CLOSE_DRAIN = 4503
CLOSE_FULL = 4429
CLOSE_UNAUTHORIZED = 4401
TOKEN_TTL_S = 24 * 3600
CONNECT_PARALLEL = 64  # dispatches and handshakes in flight at start
MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
STABLE_S = 5.0  # a connection that lived this long resets the backoff


class Fatal(Exception):
    """A problem no retry fixes (a wrong secret, a bad URL): stop with its message."""


@dataclass
class Client:
    uid: str
    gateway: str | None = None  # where it is connected now
    pushes: int = 0
    moves: int = 0  # reconnections after a drain
    refused: int = 0  # closes 4429: the gateway was full
    told: int = 0  # reconnect frames received


@dataclass
class Fleet:
    clients: list[Client]
    started: float = field(default_factory=time.monotonic)
    dispatch_errors: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, object]:
        where = Counter(c.gateway for c in self.clients if c.gateway is not None)
        return {
            "t": round(time.monotonic() - self.started, 1),
            "clients": len(self.clients),
            "connected": sum(where.values()),
            "gateways": dict(sorted(where.items())),
            "moves": sum(c.moves for c in self.clients),
            "refused": sum(c.refused for c in self.clients),
            "told": sum(c.told for c in self.clients),
            "pushes": sum(c.pushes for c in self.clients),
            "dispatch_errors": dict(self.dispatch_errors),
        }


def line(snap: dict[str, object]) -> str:
    gateways = snap["gateways"]
    assert isinstance(gateways, dict)
    spread = " ".join(f"{g}={n}" for g, n in gateways.items())
    errors = snap["dispatch_errors"]
    tail = f" refused={snap['refused']}" if snap["refused"] else ""
    tail += f" dispatch_errors={errors}" if errors else ""
    return (
        f"t={snap['t']}s connected={snap['connected']}/{snap['clients']} {spread} "
        f"moves={snap['moves']} pushes={snap['pushes']}{tail}"
    )


def retry_after(value: str | None, default: float) -> float:
    """Retry-After in seconds (a number; an HTTP date or garbage gives `default`), clamped."""
    try:
        seconds = float(value) if value is not None else default
    except ValueError:
        seconds = default
    if not math.isfinite(seconds):  # "nan" and "inf" parse as floats
        seconds = default
    return min(max(seconds, MIN_BACKOFF_S), MAX_BACKOFF_S)


async def dispatch(http: httpx.AsyncClient, token: str, fleet: Fleet) -> dict[str, str]:
    """Where to connect; waits out 503s and 429s (Retry-After), 5xx and network errors."""
    delay = MIN_BACKOFF_S
    while True:
        try:
            resp = await http.get("/v1/dispatch", headers={"Authorization": f"Bearer {token}"})
            answer = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            fleet.dispatch_errors[type(exc).__name__] += 1
        else:
            if isinstance(answer, dict) and {"ws_url", "gateway_id"} <= answer.keys():
                return answer
            if resp.status_code == 401:
                raise Fatal(
                    f"dispatch refused the client token (401: {resp.text}); "
                    "is IMROUTE_SECRET the stack's client secret?"
                )
            if resp.status_code < 500 and resp.status_code != 429:
                raise Fatal(f"dispatch answered {resp.status_code}: {resp.text}")
            fleet.dispatch_errors[str(resp.status_code)] += 1
            delay = retry_after(resp.headers.get("Retry-After"), delay)
        await asyncio.sleep(delay * random.uniform(0.5, 1.5))
        delay = min(delay * 2, MAX_BACKOFF_S)


async def run_client(
    client: Client, http: httpx.AsyncClient, secret: str, fleet: Fleet, gate: asyncio.Semaphore
) -> None:
    token = issue_token(secret, client.uid, TOKEN_TTL_S, SystemClock())
    backoff = MIN_BACKOFF_S
    async with gate:  # the first connections, a bounded number at a time
        target = await dispatch(http, token, fleet)
        ws = await _open(target, token)
    while True:
        if ws is None:
            lived = 0.0
            code = None
        else:
            code, lived = await _serve(client, target["gateway_id"], ws)
        if code == CLOSE_UNAUTHORIZED:
            raise Fatal(f"the gateway refused {client.uid}'s token (close {code})")
        if code == CLOSE_DRAIN:
            client.moves += 1  # told to go: go now, dispatch knows where
            backoff = MIN_BACKOFF_S
        else:
            # Unreachable, full (4429), try again (1013), or gone some other way: back
            # off before asking again, longer each time unless the connection had lived.
            client.refused += code == CLOSE_FULL
            if lived > STABLE_S:
                backoff = MIN_BACKOFF_S
            await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        target = await dispatch(http, token, fleet)
        ws = await _open(target, token)


async def _serve(client: Client, gateway_id: str, ws: ClientConnection) -> tuple[int | None, float]:
    """Read frames until the connection closes; (its close code, seconds it lived)."""
    opened = time.monotonic()
    client.gateway = gateway_id
    try:
        async for data in ws:
            if _is_reconnect(data):
                client.told += 1
            else:
                client.pushes += 1
    except ConnectionClosed:
        pass
    finally:
        client.gateway = None
        await ws.close()
    return ws.close_code, time.monotonic() - opened


def _is_reconnect(data: str | bytes) -> bool:
    if not isinstance(data, str) or '"reconnect"' not in data:
        return False  # cheap test first: pushes are the common case
    try:
        frame = json.loads(data)
    except ValueError:
        return False
    return isinstance(frame, dict) and frame.get("type") == "reconnect"


async def _open(target: dict[str, str], token: str) -> ClientConnection | None:
    try:
        return await connect(f"{target['ws_url']}?token={token}", open_timeout=10)
    except (OSError, TimeoutError, WebSocketException):
        return None  # the gateway went away since dispatch chose it: ask again


async def main_async(args: argparse.Namespace, secret: str) -> int:
    fleet = Fleet([Client(f"{args.prefix}{i}") for i in range(args.count)])
    gate = asyncio.Semaphore(CONNECT_PARALLEL)
    limits = httpx.Limits(max_connections=CONNECT_PARALLEL)
    async with httpx.AsyncClient(base_url=args.api, timeout=10, limits=limits) as http:
        try:
            resp = await http.get("/healthz")
        except httpx.HTTPError as exc:
            print(f"clients: no push service answers at {args.api}: {exc}", file=sys.stderr)
            return 1
        if resp.status_code >= 500:
            print(f"clients: {args.api}/healthz answered {resp.status_code}", file=sys.stderr)
        tasks = [
            asyncio.create_task(run_client(c, http, secret, fleet, gate)) for c in fleet.clients
        ]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        deadline = None if args.duration is None else loop.time() + args.duration
        try:
            while not stop.is_set():
                failed = [t for t in tasks if t.done() and t.exception() is not None]
                if failed:
                    error = failed[0].exception()
                    print(f"clients: {error}", file=sys.stderr)
                    return 2 if isinstance(error, Fatal) else 1
                snap = fleet.snapshot()
                print(json.dumps(snap) if args.json else line(snap), flush=True)
                if deadline is not None and loop.time() >= deadline:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.every)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--api", default="http://127.0.0.1:8080", help="the push service's URL")
    p.add_argument("--count", type=int, default=1000, help="clients to run (default 1000)")
    p.add_argument("--prefix", default="user", help="uids are PREFIX0 .. PREFIX<count-1>")
    p.add_argument("--every", type=float, default=1.0, help="seconds between reports")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--json", action="store_true", help="print reports as JSON lines")
    args = p.parse_args(argv)
    if args.count < 1:
        p.error(f"--count: {args.count} is not a positive number of clients")
    if args.every <= 0:
        p.error(f"--every: {args.every} is not a positive number of seconds")
    if not args.api.startswith(("http://", "https://")):
        p.error(f"--api: {args.api!r} is not an http:// or https:// URL")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    secret = os.environ.get("IMROUTE_SECRET", "")
    if not secret:
        print(
            "clients: IMROUTE_SECRET is not set: the stack's client secret signs the "
            "clients' tokens (imroute dev prints it)",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(main_async(args, secret))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
