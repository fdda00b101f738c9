"""`python -m socket_gateway` (also `imroute gateway`): run one gateway until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from shared.errors import ConfigError, ImrouteError
from shared.gc_policy import Freezer, settle
from shared.logs import configure, say
from shared.settings import GatewaySettings, misspelled
from shared.throttled import say_held
from socket_gateway.app import Gateway


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="imroute gateway", description="Run one socket gateway.")
    p.add_argument("--id", dest="gateway_id", help="gateway id (IMROUTE_GATEWAY_ID)")
    p.add_argument("--group", dest="group_id", help="group id (IMROUTE_GROUP_ID)")
    p.add_argument("--ws-host", help="WebSocket bind host (IMROUTE_WS_HOST)")
    p.add_argument("--ws-port", type=int, help="WebSocket port (IMROUTE_WS_PORT)")
    p.add_argument("--grpc-host", help="gRPC bind host (IMROUTE_GRPC_HOST)")
    p.add_argument("--grpc-port", type=int, help="gRPC port (IMROUTE_GRPC_PORT)")
    p.add_argument(
        "--advertise-host",
        help="host the push service and clients reach this gateway at (IMROUTE_ADVERTISE_HOST;"
        " needed with a wildcard bind on a host of several addresses)",
    )
    p.add_argument("--route-ttl", dest="route_ttl_s", type=float, help="route TTL in seconds")
    p.add_argument("--heartbeat", dest="heartbeat_s", type=float, help="fleet heartbeat seconds")
    p.add_argument(
        "--max-connections",
        dest="gateway_max_connections",
        type=int,
        help="refuse more clients (HTTP 503) (IMROUTE_GATEWAY_MAX_CONNECTIONS)",
    )
    p.add_argument("--zone", help="this gateway's zone, for zone_affinity (IMROUTE_ZONE)")
    p.add_argument("--redis-url", help="Redis URL (IMROUTE_REDIS_URL)")
    return p.parse_args(argv)


async def serve(settings: GatewaySettings) -> None:
    """Serve until SIGINT (stop now) or SIGTERM (drain first: clients are told to
    reconnect and closed over IMROUTE_DRAIN_WINDOW_S; a second signal stops at once)."""
    stop = asyncio.Event()
    drain = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_term() -> None:
        (stop if drain.is_set() else drain).set()

    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, on_term)
    try:
        async with Gateway(settings) as gw:
            # Long-lived start-up objects never become garbage: keep the collector off them,
            # so full collections do not walk them during fan-out; and the connections that
            # come later, once they have lived a while (shared.gc_policy).
            settle()
            freezer = asyncio.create_task(
                Freezer(settings.gc_freeze_s, settings.gc_full_s).run(), name="gc-freezer"
            )
            say(
                f"gateway {settings.gateway_id} group={settings.group_id} ready "
                f"ws={gw.info.ws_url} grpc={gw.info.grpc_address}",
                settings.log_format,
                "gateway",
                _own(settings),
            )
            try:
                await _until_stopped(gw, stop, drain)
            finally:
                freezer.cancel()
    finally:
        say_held()  # closed: what its throttled lines hold back, before the process goes
    say(f"gateway {settings.gateway_id} stopped", settings.log_format, "gateway", _own(settings))
    if gw.failure is not None:
        raise ImrouteError(f"gave up and drained: {gw.failure}")


async def _until_stopped(gw: Gateway, stop: asyncio.Event, drain: asyncio.Event) -> None:
    """Until SIGINT, a drain requested through the API has finished, or SIGTERM's drain
    has finished (or a second signal cut it short)."""
    stopped = asyncio.ensure_future(stop.wait())
    drained = asyncio.ensure_future(gw.drained.wait())
    asked = asyncio.ensure_future(drain.wait())
    try:
        await asyncio.wait({stopped, drained, asked}, return_when=asyncio.FIRST_COMPLETED)
        if asked.done() and not stopped.done() and not drained.done():
            work = asyncio.ensure_future(gw.drain())
            try:
                await asyncio.wait({stopped, work}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                work.cancel()
    finally:
        for waiter in (stopped, drained, asked):
            waiter.cancel()


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop where it is installed: its C transports write frames faster."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = GatewaySettings.load(os.environ, **vars(args))
    except ImrouteError as exc:
        print(f"imroute gateway: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format, "gateway", _own(settings))
    for slip in misspelled(os.environ):
        say(f"imroute gateway: warning: {slip}", settings.log_format, "gateway",
            _own(settings), err=True, level=logging.WARNING)  # fmt: skip

    def stopped(text: str) -> None:
        say(f"imroute gateway: {text}", settings.log_format, "gateway", _own(settings),
            err=True, level=logging.ERROR)  # fmt: skip

    try:
        run(serve(settings))
    except ConfigError as exc:
        stopped(str(exc))
        return 2
    except ImrouteError as exc:
        stopped(str(exc))
        return 1
    except OSError as exc:
        stopped(f"cannot listen: {exc}")
        return 1
    return 0


def _own(settings: GatewaySettings) -> dict[str, str] | None:
    """What every line of this gateway names: itself."""
    return {"gateway_id": settings.gateway_id} if settings.gateway_id else None


if __name__ == "__main__":
    sys.exit(main())
