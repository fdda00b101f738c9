"""What a socket may do before its 101 (socket_gateway/ws/admission.py and handshake.py):
the handshake deadline, the cap on sockets without a 101, the per-IP connect rate, and
that the defaults let a load test's connects from one address through."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from websockets.asyncio.client import connect

from socket_gateway.metrics import render
from socket_gateway.ws.admission import HandshakeLimits
from socket_gateway.ws.protocol import WsTimers
from tests.integration.stack import (
    RawClient,
    endpoint,
    endpoint_client,
    handshake_refused,
    recv_json,
    token,
)
from tests.integration.stack import gateway as stack_gateway
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def test_a_client_that_never_finishes_the_handshake_is_dropped(
    redis_url: str, prefix: str
) -> None:
    timers = WsTimers(handshake_s=0.5)
    async with (
        endpoint(redis_url, prefix, timers=timers) as gw,
        endpoint_client(gw, "bystander") as bystander,
    ):
        silent = await RawClient.open(gw)
        partial = await RawClient.open(gw)
        request = RawClient.request("slowpoke")
        partial.writer.write(request[:40])
        await wait_for(lambda: len(gw.endpoint._live) == 3, "both accepted")
        assert len(gw.endpoint._pending) == 2  # the bystander had its 101

        async def trickle() -> None:
            # Slowloris: a byte every 50 ms never finishes, and does not push the deadline.
            for b in request[40:-4]:
                partial.writer.write(bytes([b]))
                await asyncio.sleep(0.05)

        trickling = asyncio.create_task(trickle())
        started = time.monotonic()
        for raw in (silent, partial):
            assert await raw.dropped(3)
            raw.close()
        assert time.monotonic() - started < 2.5  # the deadline, not the trickle's end
        trickling.cancel()
        await wait_for(lambda: len(gw.endpoint._live) == 1, "dropped")
        assert not gw.endpoint._pending
        assert gw.endpoint.refusals.counts["handshake_timeout"] == 2
        assert [c.uid for c in gw.conns] == ["bystander"]
        # The bystander, past its own handshake long ago, is not affected.
        await bystander.send('{"type":"ping"}')
        assert await recv_json(bystander) == {"type": "pong"}


async def test_sockets_without_a_101_are_capped_and_those_over_are_closed_at_once(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    limits = HandshakeLimits(max_pre_auth=3)
    async with endpoint(redis_url, prefix, limits=limits, timers=WsTimers(handshake_s=30)) as gw:
        # Connected clients do not count: only sockets still in their handshake.
        async with (
            endpoint_client(gw, "a"),
            endpoint_client(gw, "b"),
            endpoint_client(gw, "c"),
            endpoint_client(gw, "d"),
        ):
            silent = [await RawClient.open(gw) for _ in range(3)]
            await wait_for(lambda: len(gw.endpoint._pending) == 3, "three pending")
            over = [await RawClient.open(gw) for _ in range(5)]
            for raw in over:
                assert await raw.dropped(2)  # at once: the deadline is 30 s
                raw.close()
            assert gw.endpoint.refusals.counts["pre_auth_cap"] == 5
            # One log line for the burst, not five.
            lines = [r for r in caplog.records if "pre_auth_cap" in r.getMessage()]
            assert len(lines) == 1 and lines[0].levelno == logging.WARNING
            silent[0].close()
            await wait_for(lambda: len(gw.endpoint._pending) == 2, "a place free")
            async with endpoint_client(gw, "e"):
                pass
            for raw in silent[1:]:
                raw.close()
        await wait_for(lambda: not gw.endpoint._live, "all gone")
        assert not gw.endpoint._pending


async def test_connects_per_ip_over_the_rate_get_429_with_retry_after(
    redis_url: str, prefix: str
) -> None:
    limits = HandshakeLimits(connect_rate_per_ip=0.5, connect_burst_per_ip=3)
    async with endpoint(redis_url, prefix, limits=limits) as gw:
        for uid in ("a", "b", "c"):  # the burst
            async with endpoint_client(gw, uid):
                pass
        response = await handshake_refused(gw.url(f"?token={token('d')}"))
        assert response.status_code == 429
        assert response.headers["Retry-After"] == "2"  # one connect per 2 s
        assert json.loads(response.body)["error"] == "rate_limited"
        assert gw.endpoint.refusals.counts["rate_limited"] == 1
        assert [c[1] for c in gw.calls if c[0] == "register"] == ["a", "b", "c"]


async def test_with_the_defaults_1500_connects_from_one_address_all_pass(
    redis_url: str, prefix: str
) -> None:
    # Load tests open 10k connections from one loopback address at about 1,500/s: no
    # default limit may refuse them (each is closed after its 101 to spare descriptors).
    async with endpoint(redis_url, prefix) as gw:
        accepted = 0

        async def one(i: int) -> None:
            nonlocal accepted
            raw = await RawClient.open(gw)
            raw.writer.write(RawClient.request(f"u{i}"))
            head = await raw.response_head()
            assert b" 101 " in head, head
            accepted += 1
            raw.close()

        for start in range(0, 1500, 100):
            await asyncio.gather(*(one(i) for i in range(start, start + 100)))
        assert accepted == 1500
        assert sum(gw.endpoint.refusals.counts.values()) == 0


async def test_a_gateway_takes_the_limits_from_its_settings_and_counts_in_metrics(
    redis_url: str, prefix: str
) -> None:
    async with stack_gateway(
        redis_url,
        prefix,
        "gw1",
        "g1",
        ws_connect_rate_per_ip=0.1,
        ws_connect_burst_per_ip=1,
        ws_handshake_timeout_s=0.5,
    ) as gw:
        url = f"ws://127.0.0.1:{gw.ws_port}/ws?token={token('a')}"
        async with connect(url):
            pass
        answer = await handshake_refused(url)
        assert answer.status_code == 429
        assert answer.headers["Retry-After"] == "10"
        # From another address: this one's connects are over the rate (answered at once).
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", gw.ws_port, local_addr=("127.0.0.2", 0)
        )
        assert await asyncio.wait_for(reader.read(), 3) == b""  # cut at the 0.5 s deadline
        writer.close()
        # Whichever port serves them, the metrics are these.
        text = render(gw.metrics).decode()
    assert "imroute_gateway_handshakes_refused_rate_limited_total 1.0" in text
    assert "imroute_gateway_handshakes_refused_handshake_timeout_total 1.0" in text
    assert "imroute_gateway_handshakes_refused_unauthorized_total 0.0" in text
