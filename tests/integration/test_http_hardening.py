"""The push service's HTTP edge as an attacker meets it: the key before the body, and
drains that keep a group served. The body attack runs against a real
`python -m push_service`, whose memory is what is at stake. (uvicorn's limits:
test_http_server.py; the two key scopes and the body limits per path, on the in-memory
stores: tests/api/test_http_contract.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import ADMIN_KEY, API_KEY
from tests.integration.http_raw import HOST, push_service, read_answer_blocking, request_head
from tests.integration.stack import AUTH, api, gateway
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

MIB = 1 << 20


def _empty_objects(size: int) -> bytes:
    """`{"to":[{},{},...]}` of about `size` bytes: the cheapest body to send and about the
    dearest to parse (each `{}` is a dict, and a validation error, in FastAPI)."""
    return b'{"to":[' + b"{}," * (size // 3) + b"{}]}"


def _refused_before_the_body(
    port: int, method: str, path: str, body: bytes, **headers: str
) -> tuple[int, dict[str, object]]:
    """Send the head and the first 64 KiB of `body`, and read the answer: it must come
    although the rest of the body was not sent. The rest cannot then be sent: the server
    closed the connection rather than read it. (A blocking socket: the answer stays
    readable after the reset that a close over unread data causes.)"""
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(
            request_head(
                method,
                path,
                Content_Type="application/json",
                Content_Length=str(len(body)),
                **headers,
            )
        )
        with contextlib.suppress(OSError):  # it may have answered and closed already
            sock.sendall(body[: 64 << 10])
        answer = read_answer_blocking(sock)
        assert answer is not None, "closed without an answer"
        assert answer.headers.get("connection") == "close", answer.headers
        with pytest.raises(OSError):
            sock.sendall(body[64 << 10 :])
            sock.recv(1)  # nothing more comes: EOF or a reset, after it read everything
            pytest.fail("the server read the whole body")
        return answer.status, answer.json()


async def test_an_unauthenticated_50_mib_multicast_is_refused_unread_and_costs_no_memory(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The body used to be parsed before the key was checked (160 MiB grew the process
    by about 4.2 GB). Now the answer comes from the headers; the process does not grow."""
    body = _empty_objects(50 * MIB)
    env = {"IMROUTE_ADMIN_API_KEY": ADMIN_KEY}
    with push_service(redis_url, prefix, tmp_path, **env) as (proc, port):
        process = psutil.Process(proc.pid)
        refused = functools.partial(asyncio.to_thread, _refused_before_the_body, port)
        # Warm up the paths the attack takes, so the first use of code is not counted.
        await refused("POST", "/v1/multicast", body[: 2 * MIB])
        before = process.memory_info().rss
        with _peak_rss(process) as peak:
            for _ in range(3):
                status, payload = await refused("POST", "/v1/multicast", body)
                assert status == 401
                assert payload["error"] == "unauthorized"
                assert "IMROUTE_API_KEY" in str(payload["detail"])
            status, payload = await refused(
                "POST", "/v1/multicast", body, Authorization="Bearer wrong-key-0123456789"
            )
            assert (status, payload["error"]) == (401, "unauthorized")
            # The push key on an admin endpoint is 403, before the body too.
            status, payload = await refused(
                "PUT", "/v1/users", body, Authorization=f"Bearer {API_KEY}"
            )
            assert (status, payload["error"]) == (403, "forbidden")
            assert "admin" in str(payload["detail"])
        grown = peak() - before
        # Before the gate, 50 MiB of this body grew it by about 1.3 GB at its peak.
        assert grown < 8 * MIB, f"the process grew by {grown / MIB:.1f} MiB at its peak"


@contextlib.contextmanager
def _peak_rss(process: psutil.Process) -> Iterator[Callable[[], int]]:
    """The process's highest RSS while in the block, sampled every 10 ms (from before)."""
    peak = process.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.01):
            peak = max(peak, process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield lambda: peak
    finally:
        done.set()
        sampler.join()


async def test_draining_a_groups_last_gateway_is_409_unless_forced(
    redis_url: str, prefix: str
) -> None:
    """One call used to be able to drain every gateway. g1 keeps one gateway that takes
    clients, whatever the order or the timing of the requests."""
    # gw1 and gw2 see drain requests only every 5 s: a request stays pending meanwhile,
    # and a pending request counts as a drain.
    async with (
        api(redis_url, prefix) as http,  # first: see the test below on drains
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=5) as gw1,
        gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=5) as gw2,
        gateway(redis_url, prefix, "gw3", "g2", heartbeat_s=0.2, drain_window_s=0) as gw3,
    ):
        # Two requests at once for g1's two gateways: exactly one is taken.
        answers = await asyncio.gather(
            http.post("/v1/gateways/gw1/drain", headers=AUTH),
            http.post("/v1/gateways/gw2/drain", headers=AUTH),
        )
        assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]
        refused = next(a for a in answers if a.status_code == 409).json()
        assert refused["error"] == "conflict"
        assert "last gateway of group 'g1'" in refused["detail"]
        assert "force=true" in refused["detail"]
        # Asked again, the other one is still refused.
        other = "gw2" if answers[0].status_code == 202 else "gw1"
        assert (await http.post(f"/v1/gateways/{other}/drain", headers=AUTH)).status_code == 409

        # A group of one: 409, and nothing was asked of the gateway.
        resp = await http.post("/v1/gateways/gw3/drain", headers=AUTH)
        assert resp.status_code == 409 and "'g2'" in resp.json()["detail"]
        await asyncio.sleep(0.6)  # three of gw3's heartbeats
        assert not gw3.draining
        # Forced, it drains.
        resp = await http.post("/v1/gateways/gw3/drain?force=true", headers=AUTH)
        assert resp.status_code == 202, resp.text
        await asyncio.wait_for(gw3.drained.wait(), 5)
        # A draining gateway asked again: nothing new, still 202.
        assert (await http.post("/v1/gateways/gw3/drain", headers=AUTH)).status_code == 202
        assert not gw1.draining and not gw2.draining  # their requests wait for a heartbeat


async def test_a_gateway_already_draining_leaves_its_group_one_to_keep(
    redis_url: str, prefix: str
) -> None:
    # The API first: its start (the directory's migration) can hold the loop longer
    # than these gateways' 0.6-s fleet records live, on a loaded machine.
    async with (
        api(redis_url, prefix) as http,
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2, drain_window_s=5) as gw1,
        gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=0.2) as gw2,
    ):
        assert (await http.post("/v1/gateways/gw1/drain", headers=AUTH)).status_code == 202
        await wait_for(lambda: gw1.draining, "gw1 draining (its next heartbeat)")
        # The request was taken; gw1's record says it is draining: gw2 is g1's last.
        resp = await http.post("/v1/gateways/gw2/drain", headers=AUTH)
        assert resp.status_code == 409, resp.text
        assert not gw2.draining
