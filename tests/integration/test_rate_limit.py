"""Rate limits per API key: a GCRA in one Redis script, so the limit holds across
push-service processes. Two real `python -m push_service` processes on one Redis, and
the in-process app for the details."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from push_service.ratelimit.base import RateLimit
from router.processes.ports import free_port
from shared.errors import ConfigError
from tests.conftest import API_KEY
from tests.integration.procs import push_services, service_env
from tests.integration.stack import AUTH, api

pytestmark = pytest.mark.integration

BODY = {"to": ["nobody"], "content": 1, "store": False}


async def test_the_limit_holds_across_two_push_services(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    env = service_env(
        redis_url, prefix, tmp_path, IMROUTE_RATE_LIMIT="100/s", IMROUTE_RATE_BURST="20"
    )
    ports = [free_port(), free_port()]
    async with push_services(env, ports):
        # Raw keep-alive connections: an HTTP client library in this one process could
        # not send 1,000 requests in a second on this machine; these can. A 429 closes
        # its connection (its body was never read), so the sender opens another.
        for port in ports:  # warm both processes up, then let the bucket refill
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await exchange(reader, writer, b"GET", b"/healthz", b"")
            writer.close()
        await asyncio.sleep(0.5)
        body = json.dumps(BODY).encode()
        statuses: list[int] = []
        refusals: list[tuple[dict[str, str], bytes]] = []
        sent: list[float] = []  # when each request went out
        conns = [await asyncio.open_connection("127.0.0.1", ports[n % 2]) for n in range(40)]

        async def sender(n: int) -> None:
            reader, writer = conns[n]
            for k in range(25):  # 40 connections x 25 = 1,000, one every ms in all
                await asyncio.sleep(max(0.0, start + (k * 40 + n) / 1000 - time.monotonic()))
                sent.append(time.monotonic())
                status, headers, answer = await exchange(reader, writer, b"POST", b"/v1/push", body)
                statuses.append(status)
                if status == 429:
                    refusals.append((headers, answer))
                if headers.get("connection") == "close":
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", ports[n % 2])
            writer.close()

        start = time.monotonic()
        await asyncio.gather(*(sender(n) for n in range(40)))
        elapsed = time.monotonic() - start
    passed = statuses.count(200)
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    # The rate over the time the requests took, plus the burst; not 2 x that (one
    # bucket per key, shared through Redis, not one per process). The requests were
    # judged between the first one's sending and the last one's answer: at most the
    # rate over that, and at least over the time they were sent in (a loaded machine
    # answers late, and the last answer overstated the window: 136 passed of the 172 it
    # allowed, once). 5 % of slack on top of 15 either way. One bucket per process would
    # be ~2x.
    most = 100 * elapsed + 20
    least = 100 * (max(sent) - start) + 20
    assert least - (15 + 0.05 * least) <= passed <= most + 15 + 0.05 * most, (
        passed,
        elapsed,
        max(sent) - start,
    )
    assert statuses.count(429) == 1000 - passed
    headers, answer = refusals[0]
    assert int(headers["retry-after"]) >= 1
    assert json.loads(answer)["error"] == "rate_limited"
    assert "IMROUTE_RATE_LIMIT (100/s, burst 20)" in json.loads(answer)["detail"]


async def exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: bytes,
    path: bytes,
    body: bytes,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request on a kept-alive connection; its status, headers and body."""
    writer.write(
        b"%s %s HTTP/1.1\r\nHost: push\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (method, path, API_KEY.encode(), len(body), body)
    )
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
    answer = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(head[0].split()[1]), headers, answer


async def test_the_details(redis_url: str, prefix: str) -> None:
    async with api(redis_url, prefix, rate_limit="2/s", rate_burst=3) as http:
        got = [(await http.post("/v1/push", json=BODY, headers=AUTH)).status_code
               for _ in range(4)]  # fmt: skip
        assert got == [200, 200, 200, 429]
        # Over the limit, a big body is answered from the headers (and not read).
        big = {"to": ["nobody"], "content": "x" * 60_000}
        refused = await http.post("/v1/multicast", json=big, headers=AUTH)
        assert refused.status_code == 429 and refused.headers["connection"] == "close"
        # Only the sending endpoints count: reading a job or the fleet does not.
        assert (await http.get("/v1/gateways", headers=AUTH)).status_code == 200
        # A bad key is refused by the key gate, not counted against anyone.
        assert (await http.post("/v1/push", json=BODY)).status_code == 401
        await asyncio.sleep(0.55)  # one request's worth of rate
        assert (await http.post("/v1/push", json=BODY, headers=AUTH)).status_code == 200
    # Another API key on the same Redis has a bucket of its own.
    other = "another-api-key-0123456789"
    async with api(redis_url, prefix, api_key=other, rate_limit="2/s", rate_burst=1) as http:
        headers = {"Authorization": f"Bearer {other}"}
        assert (await http.post("/v1/push", json=BODY, headers=headers)).status_code == 200


async def test_no_limit_unless_set(redis_url: str, prefix: str) -> None:
    # Load shedding off: 300 requests at once on a busy machine may lag the loop past
    # IMROUTE_HTTP_MAX_LAG_MS, and a 503 `overloaded` is not what this test is about.
    async with api(redis_url, prefix, http_max_lag_ms=0) as http:
        got = await asyncio.gather(
            *(http.post("/v1/push", json=BODY, headers=AUTH) for _ in range(300))
        )
        assert {r.status_code for r in got} == {200}


def test_bad_limits_are_named() -> None:
    assert RateLimit.parse("100/s", None) == RateLimit(100.0, 100)
    assert RateLimit.parse(" 0.5 / s ", 2) == RateLimit(0.5, 2)
    assert RateLimit.parse("0.5/s", None).burst == 1
    for bad in ("100", "100/m", "0/s", "-1/s", "fast"):
        with pytest.raises(ConfigError, match="IMROUTE_RATE_LIMIT"):
            RateLimit.parse(bad, None)
