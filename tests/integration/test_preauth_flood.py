"""One address's silent sockets do not lock a gateway's other clients out
(docs/operations/security-review.md, "Sockets before a 101"): a real gateway process, 1000
silent sockets
from 127.0.0.2 kept open (each one the gateway closes is opened again) while real
WebSocket clients connect from 127.0.0.1, with the defaults, with the per-IP connect
rate on, and with the per-address cap lifted (and the request line given 3 s) so that
the flood fills the whole pool and only the eviction of the biggest holder's oldest
socket lets them in."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from tests.integration.floods import flood
from tests.integration.procs import gateway_process, scrape
from tests.integration.stack import ready, recv_json, token

pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.usefixtures("redis")]

CLIENTS = 25


async def refusals(metrics_port: int) -> dict[str, float]:
    """imroute_gateway_handshakes_refused_<kind>_total, by kind."""
    counts = await scrape(metrics_port, "imroute_gateway_handshakes_refused_")
    return {name.removesuffix("_total"): value for name, value in counts.items()}


async def _real_client(ws_port: int, n: int) -> str | None:
    """None when a client from 127.0.0.1 got in (its 101, its route: the `recovered`
    frame, and a pong to its ping), else what it got."""
    await asyncio.sleep(n * 0.1)  # spread over the flood's life
    url = f"ws://127.0.0.1:{ws_port}/ws?token={token(f'real{n}')}"
    try:
        async with connect(url, local_addr=("127.0.0.1", 0), open_timeout=10) as ws:
            await ready(ws)
            await ws.send('{"type":"ping"}')
            pong = await recv_json(ws)
            return None if pong == {"type": "pong"} else repr(pong)
    except (OSError, TimeoutError, WebSocketException) as exc:  # reset, closed, 4xx, 5xx
        return repr(exc)


@pytest.mark.parametrize(
    ("env", "kinds"),
    [
        # The flood past 256 closed at once, the rest cut at the request line's 1 s.
        ({}, ("pre_auth_per_ip", "handshake_timeout")),
        (
            {"IMROUTE_WS_CONNECT_RATE_PER_IP": "20", "IMROUTE_WS_CONNECT_BURST_PER_IP": "30"},
            ("rate_limited",),
        ),
        # The flood may fill the whole pool, and hold each socket 3 s: only the eviction
        # of its oldest sockets lets the real clients in.
        (
            {"IMROUTE_WS_MAX_PRE_AUTH_PER_IP": "1000", "IMROUTE_WS_REQUEST_LINE_TIMEOUT_S": "3"},
            ("pre_auth_evicted",),
        ),
    ],
    ids=["defaults", "connect-rate", "eviction-only"],
)
async def test_silent_sockets_from_one_address_lock_no_other_client_out(
    redis_url: str, prefix: str, env: dict[str, str], kinds: tuple[str, ...]
) -> None:
    async with gateway_process(redis_url, prefix, **env) as (ws_port, _, metrics_port):
        async with flood(ws_port, "127.0.0.2", 1000, reopen_s=0.2) as f:
            await asyncio.sleep(0.3)
            outcomes = await asyncio.gather(*(_real_client(ws_port, n) for n in range(CLIENTS)))
            assert f.connects >= 1000
        refused = [o for o in outcomes if o is not None]
        assert not refused, f"{len(refused)} of {CLIENTS} refused: {refused[:3]}"
        counts = await refusals(metrics_port)
        assert sum(counts[kind] for kind in kinds) > 0, counts
