"""N WebSocket clients that behave like real ones, each an `imroute_client.ImrouteClient`
(clients/python): it asks `GET /v1/dispatch` where to connect, connects there, counts
the pushes it gets, and when its gateway drains (a `reconnect` frame, then close 4503)
or refuses it for being full or draining (HTTP 503, or 429 over a per-address connect
rate), asks dispatch again and moves, after the answer's Retry-After.

Every `--every` seconds it prints how the clients spread over the gateways:

    IMROUTE_SECRET=<secret> .venv/bin/python examples/clients.py --count 1000
    t=12.6s connected=1000/1000 gw1=262 gw2=247 gw3=253 gw4=238 moves=0 pushes=0

Drain a gateway meanwhile (`POST /v1/gateways/gw1/drain` with the API key) and watch
its clients move: a client told to go asks dispatch again at once, one refused by a
full gateway (503) after its Retry-After; one cut off retries the same gateway twice,
with jittered backoff, before asking dispatch. A token refused (401, by dispatch or at
the handshake) stops the run. `--json` prints the same as JSON lines; `--duration`
stops after that many seconds (else Ctrl-C). Tokens are minted with IMROUTE_SECRET, the
stack's client secret (`imroute dev` prints it), with IMROUTE_JWT_AUDIENCE and
IMROUTE_JWT_ISSUER as their `aud` and `iss` when those are set.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from imroute_client import ClientError, ImrouteClient, Unauthorized

from shared.auth import issue_token
from shared.clock import SystemClock

TOKEN_TTL_S = 24 * 3600  # the gateways' default IMROUTE_JWT_MAX_TTL_S
CONNECT_PARALLEL = 64  # dispatches and handshakes in flight at start


class Fatal(Exception):
    """A problem no retry fixes (a wrong secret, a bad URL): stop with its message."""


@dataclass
class Client:
    """One user's SDK client and what the report shows of it."""

    uid: str
    sdk: ImrouteClient | None = None
    pushes: int = 0

    @property
    def gateway(self) -> str | None:
        return self.sdk.gateway_id if self.sdk is not None else None


@dataclass
class Fleet:
    clients: list[Client]
    started: float = field(default_factory=time.monotonic)

    def snapshot(self) -> dict[str, object]:
        where = Counter(c.gateway for c in self.clients if c.gateway is not None)
        stats = [c.sdk.stats for c in self.clients if c.sdk is not None]
        errors: Counter[str] = Counter()
        for s in stats:
            errors.update(s.dispatch_errors)
        return {
            "t": round(time.monotonic() - self.started, 1),
            "clients": len(self.clients),
            "connected": sum(where.values()),
            "gateways": dict(sorted(where.items())),
            "moves": sum(s.moves for s in stats),
            "refused": sum(s.refused for s in stats),
            "told": sum(s.told for s in stats),
            "pushes": sum(c.pushes for c in self.clients),
            "dispatch_errors": dict(errors),
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


async def run_client(
    client: Client, http: httpx.AsyncClient, api: str, secret: str, gate: asyncio.Semaphore
) -> None:
    """One SDK client: dispatch, reconnects, drains and full gateways are the SDK's."""
    token = issue_token(
        secret,
        client.uid,
        TOKEN_TTL_S,
        SystemClock(),
        audience=os.environ.get("IMROUTE_JWT_AUDIENCE") or None,
        issuer=os.environ.get("IMROUTE_JWT_ISSUER") or None,
    )
    try:
        async with ImrouteClient(api, token, http=http) as sdk:
            client.sdk = sdk
            async with gate:  # the first connections, a bounded number at a time
                await sdk.connect()
            async for _ in sdk:
                client.pushes += 1
    except Unauthorized as exc:
        raise Fatal(
            f"{exc}; is IMROUTE_SECRET the stack's client secret (and IMROUTE_JWT_AUDIENCE, "
            "IMROUTE_JWT_ISSUER its settings)?"
        ) from None
    except ClientError as exc:
        raise Fatal(str(exc)) from None


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
            asyncio.create_task(run_client(c, http, args.api, secret, gate)) for c in fleet.clients
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
