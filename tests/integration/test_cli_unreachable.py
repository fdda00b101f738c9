"""The operator commands against a push service that is down or never answers, run as
real processes: a quick failure, one message naming the URL, exit 1; `--request-timeout`
and `--retries` bound a silent one, each retry said."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from router.processes.ports import HOST, free_port
from tests.integration.procs import imroute_at

pytestmark = pytest.mark.integration


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections (the kernel's backlog) and never answers: a hung
    push service."""
    with socket.socket() as listening:
        listening.bind((HOST, 0))
        listening.listen(8)
        yield listening.getsockname()[1]


async def test_a_push_service_that_is_down_is_said_at_once_naming_its_url() -> None:
    """Before: 4 tries over 3.5-7 s, then the message."""
    port = free_port()  # nothing listens there
    started = time.monotonic()
    code, out, err = await imroute_at(port, "status")
    took = time.monotonic() - started
    assert code == 1 and out == "", (code, out, err)
    assert err.splitlines() == [
        f"imroute status: cannot reach the push service at http://{HOST}:{port}/v1/gateways: "
        "[Errno 111] Connection refused (is it running there? --api-url or IMROUTE_API_URL "
        "says where)"
    ]
    assert took < 3.0, f"took {took:.1f} s"


async def test_a_silent_push_service_is_given_up_on_after_the_request_timeout_and_retries(
    silent_port: int,
) -> None:
    """Before: no such flags (exit 2); without them 4 tries of 30 s each, 2 minutes."""
    started = time.monotonic()
    code, _, err = await imroute_at(
        silent_port, "status", "--request-timeout", "0.5", "--retries", "1"
    )
    took = time.monotonic() - started
    url = f"http://{HOST}:{silent_port}/v1/gateways"
    lines = err.splitlines()
    assert code == 1 and len(lines) == 2, (code, err)
    assert lines[0].startswith(f"imroute status: {url}: no answer within 0.5 s; trying again in ")
    assert lines[0].endswith(" s (retry 1 of 1)")
    assert lines[1] == (
        f"imroute status: cannot reach the push service at {url}: no answer within 0.5 s (2 tries)"
    )
    assert took < 5.0, f"took {took:.1f} s"  # 2 x 0.5 s, 0.5-1 s between, the start-up
